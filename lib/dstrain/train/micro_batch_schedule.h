#pragma once
// One step's micro-batches through the model, the loss and the ZeRO engine: the training step's
// inner loop, the one that the trainer, the engine tests and (later) evaluation and pipeline
// schedules use. Today's schedule is sequential: for each micro-batch, in order,
//   engine.begin_micro -> forward (model::Loss) -> its share of the step's loss (below)
//   (+ the MoE aux share) -> x the engine's loss scale -> backward -> engine.end_micro
// The loss it reports leaves out the added terms (MTP), which it reports on their own.
// The share follows train.loss_normalization. Each micro-batch m has a numerator and a count of
// units; the step's loss is sum_m numerator_m / N, N the units of every micro-batch of every
// rank, summed by the caller once per step (global_loss_units):
//   global_tokens     numerator = its summed token losses, units = its trained targets: every
//                     micro-batch of every rank weighs by what it trains, and the summed
//                     gradients are the global batch's mean gradient whatever the shares,
//                     accumulation steps, world size or masks
//   micro_batch_mean  numerator = its mean token loss, units = 1 (when it trains anything): the
//                     mean of micro-batch means, DeepSpeed's and Megatron's default
//   per_sample        numerator = sum over its samples of each one's mean (data::weigh_per_sample),
//                     units = its samples: the mean of sample means
// An MoE auxiliary loss (already a mean) weighs by the micro-batch's units / N.
// Observers see each micro-batch (telemetry, the shard balancer's timings, injected faults);
// they never change what is computed, except a fault's on_loss.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/batch.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::model {
class CausalLM;
class Loss;
struct LossParts;
}  // namespace dstrain::model
namespace dstrain::zero {
class Engine;
}

namespace dstrain::train {

// What one micro-batch took, host-side (GPU work included when the schedule waits for it).
struct MicroTiming {
  double forward_ms = 0;   // from the start of the micro-batch to the forward's end
  double backward_ms = 0;  // from there to the end (a slowed rank's sleep included)
  double issue_ms = -1;    // time_phases only: host time to queue the forward and backward
  int64_t rows = 0;
};

class MicroBatchObserver {
 public:
  virtual ~MicroBatchObserver() = default;
  virtual void before_micro(size_t micro) {}
  // The micro-batch's loss before backward; a fault injection may replace it (a NaN).
  virtual at::Tensor on_loss(size_t micro, const at::Tensor& loss) { return loss; }
  virtual void after_backward(size_t micro) {}  // before the micro-batch's time is taken
  virtual void timed(size_t micro, const MicroTiming& timing) {}
};

struct ScheduleResult {
  double loss = 0;        // this rank's part of the step's loss (summed over ranks: the step's loss)
  double token_loss = 0;  // the summed (per_sample: weighted) loss over this rank's trained targets, before any division
  int64_t trained_targets = 0;
  // The loss's added terms (model::Loss::add_term: MTP's depths): each one's token-summed value,
  // before its weight, and the targets it covered, over this rank's micro-batches.
  std::vector<double> term_sums, term_counts;
  // Pipeline parallelism: this rank's compute in the schedule and the schedule's time
  // (pipeline_run::StepTimes); zero without a pipeline.
  double pipeline_compute_ms = 0, pipeline_schedule_ms = 0;
};

// A micro-batch's loss divided as train.loss_normalization says (global: the step's units over
// every rank), and the added terms' share of it (undefined without terms), which the reported
// loss leaves out.
struct DividedLoss {
  at::Tensor loss, terms_share;
};
DividedLoss divided_loss(const model::LossParts& parts, config::LossNormalization mode, double global);

// The loss's added terms summed on the device, [terms, 2] float64 (sum, count; undefined until
// a micro-batch has some), and read into a result once per step.
void add_term_sums(at::Tensor& sums, const model::LossParts& parts);
void read_term_sums(const at::Tensor& sums, ScheduleResult& out);

class MicroBatchSchedule {
 public:
  // engine: may be null for a forward-only schedule (evaluation). Everything is borrowed.
  MicroBatchSchedule(const model::CausalLM& model, const model::Loss& loss, zero::Engine* engine, const c10::Device& device);
  void add_observer(MicroBatchObserver* observer) { observers_.push_back(observer); }
  // time_phases: wait for the device after the forward and the backward (wall_clock_breakdown).
  void set_time_phases(bool on) { time_phases_ = on; }
  // train.loss_normalization (global_tokens until set). per_sample needs batches weighed by
  // data::weigh_per_sample.
  void set_normalization(config::LossNormalization mode) { normalization_ = mode; }
  // The batches (on any device) in order, `global_units` the step's units over every rank
  // (global_loss_units); backward: train (the engine accumulates the gradients, its step()
  // follows), else forward only, without autograd.
  ScheduleResult run(const std::vector<data::Batch>& batches, int64_t global_units, bool backward);

 private:
  // Sums on the device, read once per run: no extra synchronisation per micro-batch.
  struct DeviceSums {
    at::Tensor tokens, terms;  // the main token loss; each term's sum and count
  };
  double micro(const data::Batch& batch, size_t index, bool last, double global_units, bool backward, ScheduleResult& out,
               DeviceSums& sums);
  const model::CausalLM& model_;
  const model::Loss& loss_;
  zero::Engine* engine_;
  c10::Device device_;
  bool time_phases_ = false;
  config::LossNormalization normalization_ = config::LossNormalization::kGlobalTokens;
  std::vector<MicroBatchObserver*> observers_;
};

// A micro-batch's units under `mode` (see above).
int64_t loss_units(const data::Batch& batch, config::LossNormalization mode);
// The units of every rank's `batches`, summed (collective: one small all-reduce).
int64_t global_loss_units(comm::Communicator& comm, const std::vector<data::Batch>& batches,
                          config::LossNormalization mode = config::LossNormalization::kGlobalTokens);

}  // namespace dstrain::train
