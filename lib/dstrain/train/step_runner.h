#pragma once
// A step's forwards and backwards, whatever runs them: the sequential micro-batch loop
// (sequential_runner.h) and every pipeline schedule (pipeline_runner.h) implement StepRunner,
// and the trainer and the evaluator call it without asking which it is (Megatron's
// get_forward_backward_func: one signature, several runners).
//   train(batches, units)  this rank's micro-batches of one step: the objective's value of each
//                          divided by the step's units over every rank (loss_share.h), times the
//                          engine's loss scale, backward; the engine's step() follows
//   forward(batches)       evaluation: the cross-entropy alone, without autograd or observers
// Sums stay on the device (StepTotals): a runner reads nothing to the host per micro-batch; the
// engine reads a training step's sums in its one scalar all-reduce, the evaluator once per pass.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dstrain/data/batch.h"

namespace dstrain::model {
struct ObjectiveValue;
class Objective;
}  // namespace dstrain::model

namespace dstrain::train {

// What one micro-batch took, host-side (GPU work included when the runner waits for it).
struct MicroTiming {
  double forward_ms = 0;   // from the start of the micro-batch to the forward's end
  double backward_ms = 0;  // from there to the end (a slowed rank's sleep included)
  double issue_ms = -1;    // time_phases only: host time to queue the forward and backward
  int64_t rows = 0;
};

// What the trainer hangs on a runner (step_observers.h): telemetry, the shard balancer's
// timings, injected faults. Observers never change what is computed, except a fault's on_loss.
class MicroBatchObserver {
 public:
  virtual ~MicroBatchObserver() = default;
  virtual void before_micro(size_t micro) {}
  // The micro-batch's loss before backward; a fault injection may replace it (a NaN).
  virtual at::Tensor on_loss(size_t micro, const at::Tensor& loss) { return loss; }
  virtual void after_backward(size_t micro) {}  // before the micro-batch's time is taken
  virtual void timed(size_t micro, const MicroTiming& timing) {}
};

// A pass's sums on the device, float64 [2 + 2 x terms]:
//   [0] this rank's part of the step's loss (the cross-entropy's share and the auxiliary losses';
//       the objective's terms left out: summed over ranks, the step's loss)
//   [1] the summed (per_sample: weighted) cross-entropy over this rank's trained targets
//   [2 + 2t], [3 + 2t]  term t's sum (before its weight) and the targets it covered
struct StepTotals {
  at::Tensor values;
  int64_t trained_targets = 0;  // known on the host from the batches
  // Pipeline parallelism: this rank's compute in the schedule and the schedule's time
  // (pipeline_exec::StepTimes); zero without a pipeline.
  double pipeline_compute_ms = 0, pipeline_schedule_ms = 0;
};

// The same read to the host (tests, evaluation); values as StepTotals lays them out.
struct HostTotals {
  double loss = 0, token_loss = 0;
  std::vector<double> term_sums, term_counts;
  int64_t trained_targets = 0;
};
HostTotals read_totals(const StepTotals& totals);
HostTotals read_totals(const std::vector<double>& values, int64_t trained_targets);

// Builds a pass's StepTotals in place on the device: no read, the additions in micro-batch order.
class TotalsAccumulator {
 public:
  TotalsAccumulator(size_t terms, const c10::Device& device);
  // A part of the reported loss (detached scalar: a micro-batch's share, a stage's auxiliary losses).
  void add_loss(const at::Tensor& part);
  // A micro-batch's cross-entropy sum, trained targets and terms.
  void add_value(const model::ObjectiveValue& value);
  StepTotals take();

 private:
  StepTotals totals_;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual void add_observer(MicroBatchObserver* observer) = 0;
  // One training step: this rank's micro-batches in order; `global_units` the step's loss units
  // over every rank (global_loss_units). The engine accumulates the gradients; its step() follows.
  virtual StepTotals train(const std::vector<data::Batch>& batches, int64_t global_units) = 0;
  // Forwards only, without gradients: the cross-entropy sums and trained targets (a pipeline's:
  // on its last stage's ranks, zero elsewhere). Collective where the runner's ranks are.
  virtual StepTotals forward(const std::vector<data::Batch>& batches) = 0;
  // The same through another objective (the preference reference pass, which keeps what it
  // computes itself); runners that cannot throw Error{kInternal} (the config refuses them first).
  virtual StepTotals forward_with(const model::Objective& objective, const std::vector<data::Batch>& batches) = 0;
  // The micro-batches one forward() pass takes to keep every stage busy (1 without a pipeline).
  virtual int64_t forward_batches() const = 0;
};

}  // namespace dstrain::train
