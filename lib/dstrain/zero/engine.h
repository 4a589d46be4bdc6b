#pragma once
// ZeRO stages 0-3 over a Communicator, DeepSpeed's semantics:
//   0  gradients all-reduced; every rank updates everything
//   1  gradients reduce-scattered at the accumulation boundary; fp32 master weights and Adam
//      states sharded; updated parameters all-gathered
//   2  + gradients reduce-scattered every micro-batch into the owner's shard (buckets of
//      reduce_bucket_size elements, copied into one contiguous bucket): no rank keeps full grads
//   3  + parameters sharded: a layer group's parameters are gathered before its forward and again
//      before its backward, and freed after; small ones (persistence threshold) stay resident
// Communication is issued in the model's group order (see model::LayerGate), identically on
// every rank. With overlap_comm a group's gradients are reduced as soon as backward leaves the
// group, while backward goes on, and stage 3 prefetches the next group's parameters.
// The optimizer is the fused Adam on the rank's fp32 shard, on the training device (the CPU
// kernel, or the CUDA kernel on a GPU). With offload_optimizer the shard and its Adam states live
// in pinned host memory: the gradient shard is copied down in the model dtype, in chunks of whole
// parameters, while the CPU widens and updates the previous chunk, and each updated chunk goes
// back up at once (in the model dtype). With offload_param as well (stage 3, ZeRO-Infinity's CPU tier), the
// model-dtype parameter shard lives in pinned host memory, written there by the CPU update, and a
// layer group's chunks go up to the device just before its all-gather (with the prefetch).
// With delayed_update (ZeRO-Offload's DPU), step t's CPU update runs on a thread during step t+1
// and is applied at the end of step t+1 (a checkpoint applies it first: settle()).
// fp16 uses the dynamic loss scaler.
// Expert parallelism (ExpertGroups): the model holds only its block of routed experts. Their
// units are split, reduced and gathered over the expert-data-parallel group (the ranks holding
// the same block), every other unit over the world; gradients are still averaged over the world
// (each rank's loss is its share of the global batch), and the gradient norm counts each expert
// once. Checkpoints hold every expert under its global name, whatever the expert-parallel size.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/model/named_tensor.h"
#include "dstrain/model/stateful.h"
#include "dstrain/optim/cpu_adam.h"
#include "dstrain/zero/layout.h"
#include "dstrain/zero/loss_scaler.h"

namespace dstrain::ckpt {
struct ShardTable;
}
namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
class CausalLM;
}

namespace dstrain::zero {

struct MicroState;
using MicroBatch = std::shared_ptr<MicroState>;

struct EngineOptions {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000;  // elements per unit of communication
  bool overlap_comm = false;
  bool offload_optimizer = false;              // master weights + Adam states in (pinned) host memory, the step on the CPU
  bool offload_param = false;                  // stage 3 with offload_optimizer: the model-dtype parameter shard in host memory too
  bool pin_memory = true;                      // offloaded host memory page-locked (GPU runs): copies overlap
  bool delayed_update = false;                 // offload: step t's CPU update runs during step t+1, applied at its end
  int64_t delayed_update_after = 0;            // ... once this many updates were applied without delay
  at::Device device = at::kCPU;                // the model, gradients and collectives: the communicator's device
  int64_t offload_chunk = int64_t{16} << 20;   // offload: elements per copy/update chunk (whole parameter segments)
  int64_t prefetch_bucket_size = 50000000;     // stage 3: prefetch the next group when it is at most this
  int64_t persistence_threshold = 100000;      // stage 3: parameters below this stay resident
  config::Dtype dtype = config::Dtype::kFp32;  // parameters, activations, gradients
  optim::AdamHyper adam;                       // lr and step are set per step
  double grad_clip = 0;                        // 0: off
  bool average_over_ranks = true;              // divide summed gradients by the world size
  LossScalerConfig loss_scaler;                // fp16 only
  // Pipeline parallelism: a stage's micro-batches interleave with other stages' in the schedule,
  // so no collective runs per micro-batch (torchtitan's approach): stage 3 gathers every
  // parameter at the first begin_micro() of a step and frees them at the step's end_micro(), and
  // every stage reduces the gradients accumulated over the step's micro-batches there, once. The
  // schedule calls begin_micro(true) before the step's first forward and end_micro() after its
  // last backward; the layer gate does nothing in between (no overlap_comm, no prefetch).
  bool step_boundary_comm = false;
  // false: checkpoints leave the frozen parameters out (a LoRA run's base, which the checkpoint
  // names instead: ckpt::BaseModel), and loading leaves them as they are.
  bool checkpoint_frozen = true;
};

// Expert parallelism's two groups, split from the engine's communicator (they outlive the engine).
struct ExpertGroups {
  comm::Communicator* parallel = nullptr;  // the ranks one layer's routed experts are spread over (E consecutive ranks)
  comm::Communicator* data = nullptr;      // the ranks that hold the same experts (world / E, every E-th rank)
};

// The recipe's zero, precision and optimizer sections for an engine on `device`.
EngineOptions options_from(const config::Recipe& recipe, const at::Device& device);

struct MemoryReport {
  int64_t params = 0;       // model-dtype parameters resident on this rank's device
  int64_t host_params = 0;  // stage 3 offload_param: the parameter shard in host memory
  int64_t grads = 0;        // gradient storage kept across micro-batches
  int64_t master = 0;       // fp32 master weights (the shard)
  int64_t optimizer = 0;    // Adam exp_avg + exp_avg_sq (the shard)
  // The ZeRO paper's formula for the same numbers (Psi parameters, N ranks).
  int64_t formula_params = 0, formula_grads = 0, formula_optimizer = 0;
};

struct StepResult {
  double grad_norm = 0;             // of the averaged, unscaled gradients, before clipping
  bool skipped = false;             // fp16 overflow: no update
  double loss_scale = 1;            // the scale this step used
  std::vector<double> sums;         // the caller's extra values, summed over ranks
  std::vector<double> device_sums;  // the caller's device values (StepScalars::device), summed over ranks
  at::Tensor expert_load;     // MoE: the step's tokens per expert, summed over ranks [moe layers, routed experts] (the bias moved by it)
  double comm_wait_ms = 0;    // time this step blocked on collectives (what overlap did not hide)
  double reduce_wait_ms = 0;  // ... of it on gradient reductions
  double gather_wait_ms = 0;  // ... and on parameter all-gathers (stage 3, and after the update)
};

// What the caller adds to the step's one scalar all-reduce: values on the host, and values still
// on the device (a runner's loss sums: float64, 1-D), read to the host only there, once per step.
// A non-finite device value (a NaN loss) counts as non-finite gradients on this rank: no rank
// updates.
struct StepScalars {
  std::vector<double> host;
  at::Tensor device;
};

// engine.state in checkpoints: the fp16 loss scaler and the count of skipped steps, as
// kValues doubles (the format every checkpoint since v2 uses).
struct EngineState {
  static constexpr int64_t kValues = 5;
  LossScalerState scaler;
  int64_t skipped_steps = 0;
  std::vector<double> values() const;
  // Throws Error{kCheckpoint} unless `values` holds kValues numbers.
  static EngineState from_values(const std::vector<double>& values);
};

class Engine final : public model::Stateful {
 public:
  // Takes over the model's parameters: they become views of the engine's flat buffers, in the
  // configured dtype. Collective: every rank constructs it at the same point.
  // With expert groups (expert_parallel_size > 1), the model must hold this rank's experts only.
  // step_world: pipeline parallelism, where `comm` is the stage's data-parallel group: every rank
  // of every stage, for the step's one scalar all-reduce (the caller's sums, the gradient norm
  // over all stages, the skip decision), so that every stage clips and skips alike.
  Engine(model::CausalLM& model, comm::Communicator& comm, const EngineOptions& options, const ExpertGroups& experts = {},
         comm::Communicator* step_world = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The factor the loss is multiplied by before backward (the fp16 loss scale, else 1).
  double loss_scale() const;
  // Around each micro-batch's forward and backward; `last` marks the accumulation boundary. The
  // handle is the micro-batch's reduction state (the schedule passes it back to end_micro).
  MicroBatch begin_micro(bool last);
  void end_micro(const MicroBatch& micro);
  // Forwards outside a step under step_boundary_comm (evaluation through a pipeline), whose layer
  // gate gathers nothing: at stage 3 every parameter is gathered before and freed after
  // (collective over the engine's ranks); otherwise nothing to do.
  void gather_for_forward();
  void release_after_forward();
  // Reduces what is left, sums `sums` over ranks, checks overflow, clips, updates and re-gathers.
  // `applied_step` is the 1-based count of applied updates including this one (bias correction).
  // beta1/beta2 >= 0 replace the configured ones for this step (schedules that cycle momentum).
  StepResult step(double lr, int64_t applied_step, const StepScalars& scalars, double beta1 = -1, double beta2 = -1);
  StepResult step(double lr, int64_t applied_step, const std::vector<double>& sums, double beta1 = -1, double beta2 = -1) {
    return step(lr, applied_step, StepScalars{sums, {}}, beta1, beta2);
  }
  int64_t skipped_steps() const { return skipped_; }

  MemoryReport memory() const;
  const Layout& layout() const;
  std::string describe() const;  // one line for the log

  // Checkpoints, in the same names at every stage and world size: the parameters (fp32 master),
  // exp_avg.<name> and exp_avg_sq.<name>, sharded; and the replicated engine.state (Stateful).
  // full_state() allocates the sharded ones whole; gather_full_state() fills them (collective; a
  // rank that passes an empty list only takes part): for writers without a shared filesystem.
  model::NamedTensors full_state() const;
  void gather_full_state(const model::NamedTensors& full);

  // Sharded checkpoints: this rank's runs of the master weights (under the parameters' names),
  // exp_avg.<name> and exp_avg_sq.<name>, as (tensor, element start, count, data). At stage 0
  // every rank holds everything: only rank 0's runs are unique (shard_replicated()).
  struct ShardRun {
    std::string tensor;
    int64_t start = 0, count = 0;
    float* data = nullptr;
  };
  std::vector<ShardRun> shard_runs() const;
  // The runs this rank writes into a checkpoint: every rank's own at stage 1-3; at stage 0 the
  // replicated runs once (rank 0, and with expert parallelism each expert block's first holder).
  std::vector<ShardRun> saved_shard_runs() const;
  // The ranks 0..n-1 whose saved_shard_runs() are not empty.
  int shard_writers() const;
  // Name, dtype and shape of every sharded tensor the engine saves (no allocation).
  struct StateTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
  };
  // Where shard_runs() lie in every rank's checkpoint file (format 3): the layout's units, so
  // that the manifest need not list every rank's pieces. Only when has_shard_table(): sharded,
  // one domain (with expert parallelism the manifest lists every rank's pieces).
  ckpt::ShardTable shard_table() const;
  bool has_shard_table() const;
  // Every expert's, not only this rank's (global names).
  std::vector<StateTensor> state_tensors() const;
  bool shard_replicated() const;
  // engine.state (EngineState), as a float64 tensor.
  model::NamedTensors state() const override;
  void load_state(const model::NamedTensors& state) override;
  // After shard_runs()' memory was filled from a checkpoint: rebuild the parameters (collective).
  void publish_loaded_shard();
  // A shard on a GPU is read and written through host copies that shard_runs() makes; after a
  // save they are no longer needed (12 bytes per shard element of host memory).
  void drop_host_copies();

  // delayed_update: applies a pending CPU update now and publishes it (collective; before a
  // checkpoint, so that the saved and the running parameters agree). No-op otherwise.
  void settle();

  // TR-DPO's reference update (preference.sync_ref_model): every parameter p of this engine's
  // model, all frozen, becomes (1 - alpha) p + alpha q, q the same parameter of `source`'s model (a
  // model of the same shape and parallel layout), in the model dtype as TRL's SyncRefModelCallback
  // mixes them. At stage 3 both are gathered group by group and this rank keeps its chunk.
  // Collective over both engines' ranks.
  void mix_from(const Engine& source, double alpha);

  // This rank's gradients of the step being computed count as non-finite: the step's overflow
  // check then skips the update on every rank, as an fp16 overflow does. For a rank whose loss
  // is NaN/Inf (its gradients may be finite garbage), and for an injected overflow (faults).
  void mark_gradients_nonfinite() { nonfinite_marked_ = true; }
  // Forgets the collective waits since the last step (an evaluation's stage-3 gathers): the next
  // step's comm_wait_ms is its own.
  void discard_wait_times();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t skipped_ = 0;
  bool nonfinite_marked_ = false;
};

}  // namespace dstrain::zero
