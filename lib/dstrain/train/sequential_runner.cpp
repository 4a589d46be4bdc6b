#include "dstrain/train/sequential_runner.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>

#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"
#include "dstrain/device/training_device.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/objective.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {
namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
}  // namespace

SequentialRunner::SequentialRunner(const model::CausalLM& model, const model::Objective& objective, zero::Engine* engine,
                                   const c10::Device& device)
    : model_(model), objective_(objective), cross_entropy_(std::make_unique<model::Objective>(objective.cross_entropy_only())),
      engine_(engine), device_(device) {}

SequentialRunner::~SequentialRunner() = default;

StepTotals SequentialRunner::train(const std::vector<data::Batch>& batches, int64_t global_units) {
  // Divided by the whole global batch's units: a rank without targets (or a global batch
  // without any) contributes nothing rather than a division by zero.
  const double global = static_cast<double>(std::max<int64_t>(global_units, 1));
  TotalsAccumulator sums(objective_.num_terms(), device_);
  for (size_t m = 0; m < batches.size(); ++m) micro(batches[m], m, m + 1 == batches.size(), global, sums);
  return sums.take();
}

StepTotals SequentialRunner::forward(const std::vector<data::Batch>& batches) { return forward_with(*cross_entropy_, batches); }

StepTotals SequentialRunner::forward_with(const model::Objective& objective, const std::vector<data::Batch>& batches) {
  c10::NoGradGuard no_grad;
  TotalsAccumulator sums(objective.num_terms(), device_);
  for (const data::Batch& b : batches) sums.add_value(objective(model_, b.to(device_)));
  return sums.take();
}

void SequentialRunner::micro(const data::Batch& host_batch, size_t index, bool last, double global, TotalsAccumulator& sums) {
  const zero::MicroBatch reduction = engine_ ? engine_->begin_micro(last) : nullptr;
  const auto c0 = Clock::now();
  progress::enter(progress::Phase::kForward);
  for (MicroBatchObserver* o : observers_) o->before_micro(index);
  const data::Batch batch = host_batch.to(device_);
  if (normalization_ == config::LossNormalization::kPerSample && !batch.target_weights.defined())
    throw Error(ErrorCode::kInternal, "per_sample loss normalization on a batch without target weights", "report this as a bug");
  const model::ObjectiveValue value = objective_(model_, batch);
  const LossShare share = loss_share(value, host_batch, normalization_, global);
  const auto issued = Clock::now();                // the forward's work is queued (launch overhead, below)
  if (time_phases_) device::synchronize(device_);  // GPU kernels run asynchronously: the breakdown waits for them, as DeepSpeed's timers do
  const auto f1 = Clock::now();
  at::Tensor loss = share.loss;
  for (MicroBatchObserver* o : observers_) loss = o->on_loss(index, loss);
  sums.add_loss(share.reported(loss));
  sums.add_value(value);
  MicroTiming timing;
  timing.rows = batch.rows();
  progress::enter(progress::Phase::kBackward);
  const auto b0 = Clock::now();
  const double scale = engine_ ? engine_->loss_scale() : 1.0;
  (scale == 1.0 ? loss : loss * scale).backward();
  if (reduction) engine_->end_micro(reduction);
  if (time_phases_) {
    // Host time to issue the work, against the time the GPU took to do it: near equal means the
    // step is launch-bound (issue 21).
    timing.issue_ms = ms_between(c0, issued) + ms_between(b0, Clock::now());
    device::synchronize(device_);
  }
  for (MicroBatchObserver* o : observers_) o->after_backward(index);
  const auto end = Clock::now();
  timing.forward_ms = ms_between(c0, f1), timing.backward_ms = ms_between(f1, end);
  for (MicroBatchObserver* o : observers_) o->timed(index, timing);
}

}  // namespace dstrain::train
