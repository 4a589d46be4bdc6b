#include "dstrain/train/micro_batch_schedule.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <optional>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"
#include "dstrain/device/training_device.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {
namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
}  // namespace

MicroBatchSchedule::MicroBatchSchedule(const model::CausalLM& model, const model::Loss& loss, zero::Engine* engine,
                                       const c10::Device& device)
    : model_(model), loss_(loss), engine_(engine), device_(device) {}

ScheduleResult MicroBatchSchedule::run(const std::vector<data::Batch>& batches, int64_t global_units, bool backward) {
  ScheduleResult out;
  // Divided by the whole global batch's units: a rank without targets (or a global batch
  // without any) contributes nothing rather than a division by zero.
  const double global = static_cast<double>(std::max<int64_t>(global_units, 1));
  std::optional<c10::NoGradGuard> forward_only;
  if (!backward) forward_only.emplace();
  DeviceSums sums;
  for (size_t m = 0; m < batches.size(); ++m) {
    const bool last = m + 1 == batches.size();
    out.loss += micro(batches[m], m, last, global, backward, out, sums);
  }
  if (sums.tokens.defined()) out.token_loss = sums.tokens.item<double>();
  read_term_sums(sums.terms, out);
  return out;
}

DividedLoss divided_loss(const model::LossParts& parts, config::LossNormalization mode, double global) {
  const double divisor =
      mode == config::LossNormalization::kMicroBatchMean ? static_cast<double>(std::max<int64_t>(parts.count, 1)) * global : global;
  return {parts.sum / divisor, parts.terms.empty() ? at::Tensor() : (parts.sum.detach() - parts.main) / divisor};
}

void add_term_sums(at::Tensor& sums, const model::LossParts& parts) {
  if (parts.terms.empty()) return;
  std::vector<at::Tensor> rows;
  for (const model::TermValue& t : parts.terms) rows.push_back(at::stack({t.sum.to(at::kDouble), t.count.to(at::kDouble)}));
  const at::Tensor terms = at::stack(rows);
  sums = sums.defined() ? sums + terms : terms;
}

void read_term_sums(const at::Tensor& sums, ScheduleResult& out) {
  if (!sums.defined()) return;
  const at::Tensor terms = sums.cpu();
  for (int64_t t = 0; t < terms.size(0); ++t)
    out.term_sums.push_back(terms[t][0].item<double>()), out.term_counts.push_back(terms[t][1].item<double>());
}

double MicroBatchSchedule::micro(const data::Batch& host_batch, size_t index, bool last, double global, bool backward, ScheduleResult& out,
                                 DeviceSums& sums) {
  const zero::MicroBatch reduction = backward && engine_ ? engine_->begin_micro(last) : nullptr;
  const auto c0 = Clock::now();
  progress::enter(progress::Phase::kForward);
  for (MicroBatchObserver* o : observers_) o->before_micro(index);
  const data::Batch batch = host_batch.to(device_);
  if (normalization_ == config::LossNormalization::kPerSample && !batch.target_weights.defined())
    throw Error(ErrorCode::kInternal, "per_sample loss normalization on a batch without target weights", "report this as a bug");
  const model::LossParts parts = loss_(model_, batch);
  const double units = static_cast<double>(loss_units(host_batch, normalization_));
  const DividedLoss divided = divided_loss(parts, normalization_, global);
  at::Tensor loss = divided.loss;
  const at::Tensor& terms_share = divided.terms_share;
  const auto issued = Clock::now();                // the forward's work is queued (launch overhead, below)
  if (time_phases_) device::synchronize(device_);  // GPU kernels run asynchronously: the breakdown waits for them, as DeepSpeed's timers do
  const auto f1 = Clock::now();
  // The auxiliary losses are means over the micro-batch: weighted by its share of the units.
  if (parts.aux.defined()) loss = loss + parts.aux * (units / global);
  for (MicroBatchObserver* o : observers_) loss = o->on_loss(index, loss);
  const double value = (terms_share.defined() ? loss.detach() - terms_share : loss).item<double>();
  const at::Tensor summed = parts.main.to(at::kDouble);
  sums.tokens = sums.tokens.defined() ? sums.tokens + summed : summed;
  add_term_sums(sums.terms, parts);
  out.trained_targets += parts.count;
  MicroTiming timing;
  timing.rows = batch.rows();
  if (backward) {
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
  }
  for (MicroBatchObserver* o : observers_) o->after_backward(index);
  const auto end = Clock::now();
  timing.forward_ms = ms_between(c0, f1), timing.backward_ms = ms_between(f1, end);
  for (MicroBatchObserver* o : observers_) o->timed(index, timing);
  return value;
}

int64_t loss_units(const data::Batch& batch, config::LossNormalization mode) {
  switch (mode) {
    case config::LossNormalization::kMicroBatchMean:
      return batch.trained_targets > 0 ? 1 : 0;
    case config::LossNormalization::kPerSample:
      return batch.samples;
    case config::LossNormalization::kGlobalTokens:
      break;
  }
  return batch.trained_targets;
}

int64_t global_loss_units(comm::Communicator& comm, const std::vector<data::Batch>& batches, config::LossNormalization mode) {
  int64_t mine = 0;
  for (const data::Batch& b : batches) mine += loss_units(b, mode);
  return comm::sum_exactly(comm, mine);
}

}  // namespace dstrain::train
