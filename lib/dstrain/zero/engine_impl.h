#pragma once
// The ZeRO engine's state and the operations on it, private to the engine's source files, one job
// each: engine.cpp (construction, the step: norm, clipping, update, memory), engine_setup.cpp
// (buffers, layout, the optimizer's runs), engine_offload.cpp (the host update, the delayed
// update), engine_collectives.cpp (stage 3 gathering, gradient reduction, the layer gate, the
// micro-batch boundaries) and engine_state.cpp (what checkpoints save and load).
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/optim/fused_step.h"
#include "dstrain/zero/engine.h"

namespace dstrain::zero {

// Stage 3 frees a unit's storage between uses; the parameters stay views of it (their sizes and
// autograd state untouched), and autograd's saved references see the data again once regathered.
void free_storage(const at::Tensor& t);
void allocate_storage(const at::Tensor& t);
bool storage_present(const at::Tensor& t);
// The stream PyTorch orders work on for a GPU (the current one); events on it mark copies done.
c10::Stream current_stream(const at::Device& device);
// Blocks on a collective and adds the time spent blocked to `waited_ms`: communication that
// overlap_comm hid behind backward costs (almost) nothing here.
void timed_wait(comm::Work& work, double& waited_ms);

// A reduction in flight.
struct Pending {
  comm::WorkHandle work;
  at::Tensor received;  // stage 1-3: the reduce-scatter's output
  int unit = 0;
};

// One micro-batch's reduction state, from begin_micro() until its reductions are drained (at
// end_micro for stage 2/3, at step() for stage 0/1): the backward hooks its forward registered
// hold it, so nothing of it lives in the engine between micro-batches.
struct MicroState {
  bool last = true;           // the accumulation boundary: stage 0/1 reduce now
  std::vector<bool> flushed;  // by layer group: its gradients are on their way
  std::vector<Pending> pending;
};

struct Engine::Impl final : model::LayerGate {
  model::CausalLM& model;
  comm::Communicator& comm;
  EngineOptions opt;
  int rank = 0, world = 1;
  int shard_world = 1;  // 1 at stage 0 (nothing is sharded), else world
  at::ScalarType dtype = at::kFloat;
  at::Device device;        // model, gradients, collectives
  at::Device optim_device;  // master weights and Adam states: the device, or the CPU when offloaded
  bool offload = false;
  bool params_on_host = false;  // stage 3 offload_param: param_shard in (pinned) host memory
  // Expert parallelism: E ranks share one layer's routed experts; the world / E ranks with the
  // same block (the expert-data-parallel group) reduce and gather the expert units among them.
  ExpertGroups experts;
  comm::Communicator* step_world = nullptr;  // pipeline parallelism: the step's scalars over every stage
  int ep = 1, ep_rank = 0, edp_world = 1, edp_rank = 0;
  Layout layout;
  std::vector<ShardSegment> segments;
  std::vector<at::Tensor> params;           // the model's parameter handles
  std::vector<at::Tensor> unit_full;        // per unit, model dtype, padded
  std::vector<bool> resident;               // stage 3: kept gathered
  std::vector<comm::WorkHandle> gathering;  // stage 3: an all-gather in flight per unit
  std::vector<std::vector<int>> units_of_group;
  at::Tensor param_shard;   // stage 3: this rank's chunks of every trained unit (model dtype)
  at::Tensor frozen_shard;  // stage 3: this rank's chunks of every frozen unit (model dtype)
  // Checkpoints: the frozen parameters this rank saves or loads, in fp32 (see frozen_runs()).
  mutable at::Tensor frozen_mirror;
  at::Tensor master, exp_avg, exp_avg_sq;  // fp32, this rank's shard, on optim_device
  // Offload: this rank's updated chunks in the model dtype on the device (stage 3: param_shard),
  // the pinned staging of the gradient shard (GPU only), and the chunks as segment index ranges.
  at::Tensor published, host_grads;
  std::vector<std::pair<size_t, size_t>> offload_chunks;
  // delayed_update: the CPU update of the last step runs on `updater`, from its gradients copied
  // to host_grads, into master and `staged` (model dtype, host); the next step applies it.
  std::thread updater;
  std::exception_ptr update_error;
  bool update_pending = false;
  at::Tensor staged;
  // Host copies of the optimizer shard for checkpoints when it lives on a GPU.
  mutable at::Tensor mirror[3];
  mutable bool mirrored = false;
  std::vector<at::Tensor> unit_grad;  // stage 0/1: full per-unit gradient buffers (p.grad are views);
                                      // stage 1 reduce-scatters each into its own chunk
  at::Tensor grad_shard;              // stage 2/3: this rank's gradient chunks, model dtype
  // Stage 1/2 on several ranks: this rank's updated chunks in the model dtype, all-gathered from
  // here (stage 3 uses param_shard; stage 0 and one rank write the full buffers directly).
  at::Tensor model_shard;
  std::unique_ptr<optim::FusedStep> fused;  // the norm and the update over the shard's runs
  // Stage 0 with expert parallelism: the runs whose gradients this rank counts in the global norm
  // (the dense ones on rank 0, an expert block's on its first holder); null when all or none are.
  std::unique_ptr<optim::FusedStep> norm_only;
  bool norm_counts_none = false;
  MicroBatch current;                 // the micro-batch whose forward runs (begin_micro .. end_micro)
  std::vector<MicroBatch> undrained;  // begun, with reductions still to wait for, in begin order
  bool grads_fresh = true;            // the shard accumulator holds nothing yet this step
  double waited_ms = 0;               // blocked on gradient reductions since the last step() returned
  double waited_gather_ms = 0;        // blocked on parameter all-gathers since then
  LossScaler scaler;

  Impl(model::CausalLM& m, comm::Communicator& c, const EngineOptions& o, const ExpertGroups& x);

  // Both groups or none; E x (world / E) ranks. Without expert parallelism (E = 1) there are none.
  static ExpertGroups checked_groups(const comm::Communicator& c, const ExpertGroups& x);

  at::TensorOptions on_device(at::ScalarType t) const { return at::TensorOptions().dtype(t).device(device); }
  // A piece of the parameter shard where the collectives work: itself, or (offload_param) an
  // asynchronous copy up from pinned host memory, ordered before the all-gather on the stream
  // (the communicator holds it until the op is done).
  at::Tensor on_device_copy(const at::Tensor& piece) const { return piece.to(device, /*non_blocking=*/true); }
  // fp32 optimizer state on optim_device. `copied`: offloaded from a GPU, it is the source or
  // target of the per-step copies (master weights, gradient staging), so it is pinned for DMA;
  // the Adam moments never move and stay pageable.
  at::Tensor state_buffer(int64_t n, bool copied = false) const;
  // A host buffer that copies go to and from a GPU: pinned (exactly its size; ATen's pinned
  // allocator would round it up to a power of two) unless pin_memory is off or there is no GPU.
  at::Tensor host_buffer(int64_t n, at::ScalarType t, const char* what) const;

  // The parameters where the model placed them (model::ParamPlace); their names are only labels.
  static std::vector<Layout::Param> layout_params(const model::CausalLM& m, bool expert_parallel);

  // A ZeRO domain: the ranks its units are split over (the world, or for routed experts the
  // expert-data-parallel group), this rank's place among them, and whether its units train
  // (frozen ones are gathered like the others but never reduced, and hold no optimizer state).
  struct Domain {
    comm::Communicator* group = nullptr;
    int rank = 0, world = 1;
    bool trains = true;
  };
  Domain domain_of(const Unit& u) const {
    return u.expert ? Domain{experts.data, edp_rank, edp_world, u.trains} : Domain{&comm, rank, world, u.trains};
  }
  comm::Communicator& comm_of(const Unit& u) const { return *domain_of(u).group; }
  int place_of(const Unit& u) const { return domain_of(u).rank; }
  int ranks_of(const Unit& u) const { return domain_of(u).world; }
  int64_t my_chunk_start(const Unit& u) const { return (opt.stage == 0 ? 0 : place_of(u)) * u.chunk(); }
  // Stage 3: where a unit's chunk of this rank lives (the trained or the frozen shard).
  const at::Tensor& shard_of(const Unit& u) const { return u.trains ? param_shard : frozen_shard; }
  // Stage 0 without expert parallelism: every rank holds every reduced gradient, its own norm is the norm.
  bool replicated_norm() const { return opt.stage == 0 && ep == 1; }
  // The name of this rank's parameter `index` in expert-parallel rank `target`'s block.
  std::string name_on(size_t index, int target) const;
  int last_group() const { return layout.num_groups() - 1; }

  void build();

  // Expert parallelism: checks the model holds this rank's block of routed experts; (stage 0) the runs it counts in
  // the gradient norm, so that the world's sum counts every gradient once.
  void plan_expert_norm(const std::vector<optim::StepRun>& runs);

  // This rank's part of the global squared gradient norm, given the squares of all it holds.
  at::Tensor counted_sum_squares(const at::Tensor& all) const;

  // The optimizer's runs: per shard segment, where its gradient is (the reduced full buffer at
  // stage 0/1, the gradient shard at 2/3) and where its updated model-dtype copy goes. Offloaded,
  // only the gradients are read here (for the norm): the update runs on the host.
  std::vector<optim::StepRun> step_runs();

  // The shard range [begin, end) that segments [first, last) span.
  std::pair<int64_t, int64_t> span_of(const std::pair<size_t, size_t>& chunk) const;

  // Offloaded update: gradient chunks go down to pinned memory in the model dtype (all queued at
  // once, an event after each); the CPU updates chunk k as soon as it has arrived, while later
  // chunks are still in flight, in one pass that widens the gradients in registers (exactly:
  // bit-identical to widening on the device) and writes the updated weights in the model dtype;
  // each updated chunk goes straight back up, in the model dtype.
  void offload_update(const at::Tensor& grads, const optim::AdamHyper& h, float scale);

  // Adam on chunk c of the shard from `source` (the host gradient shard, model dtype), the updated
  // weights also written to `out` (host, model dtype, the shard's length; undefined: nowhere).
  // Returns the chunk's shard range.
  std::pair<int64_t, int64_t> update_chunk(size_t c, const at::Tensor& source, const at::Tensor& out, const optim::AdamHyper& h,
                                           float scale);

  // --- delayed_update (ZeRO-Offload's DPU) ----------------------------------------------------
  // This step's gradients go to host memory, and the CPU update from them starts on `updater`;
  // the model keeps the parameters it has until apply_delayed() at the end of the next step.
  void start_delayed(const at::Tensor& grads, const optim::AdamHyper& h, float scale);
  // Waits for a running update (master and the moments are then complete); rethrows its error.
  void join_delayed();
  // The pending update into the model: `published`, then every rank's full buffers (collective).
  void apply_delayed();

  // Where a test injects an overflow: the first gradient element of this rank's first parameter
  // run (never padding, which the norm does not read); undefined when the rank owns no elements.
  at::Tensor first_grad();

  // The gradient shard in the model dtype, contiguous, for the offloaded update: the shard itself
  // at stage 2/3, this rank's chunks of the reduced full buffers at stage 0/1.
  at::Tensor grad_shard_contiguous() const;

  // --- stage 3 parameter gathering ------------------------------------------------------------
  void start_gather(int group);
  void finish_gather(int group);
  void release(int group);
  int64_t group_numel(int group) const;
  void prefetch(int group);

  // --- gradient reduction ---------------------------------------------------------------------
  // Launches the reduction of a group's gradients (stage 0/1: at the boundary only; 2/3: every
  // micro-batch) and, at stage 3, frees its parameters.
  void flush(MicroState& micro, int group);

  void drain(MicroState& micro);
  void drain_all();

  // The updated chunks in the model dtype, already written by the step (or write_params) to the
  // full buffers, param_shard or model_shard (offloaded: to `published`), go to everyone's full
  // buffers (all-gathered; stage 3 gathers non-resident units on demand instead).
  void publish_params();

  // This rank's runs of the optimizer state (Engine::shard_runs); saved_only: those it writes.
  // The frozen parameters' runs come last, through frozen_mirror.
  std::vector<ShardRun> runs(bool saved_only) const;
  // The frozen parameters a rank saves (saved_only) or loads: where their model-dtype values live.
  struct FrozenPiece {
    int param = 0;
    int64_t param_offset = 0, numel = 0;
    at::Tensor values;  // a view of unit_full or frozen_shard
  };
  std::vector<FrozenPiece> frozen_pieces(bool saved_only) const;
  // After a load: the frozen values read into frozen_mirror go to where they live.
  void publish_loaded_frozen();

  // --- model::LayerGate -----------------------------------------------------------------------
  void before_group(int group) override;

  at::Tensor after_group(int group, const at::Tensor& output) override;
};

}  // namespace dstrain::zero
