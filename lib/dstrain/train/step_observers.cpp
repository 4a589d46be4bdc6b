#include "dstrain/train/step_observers.h"

#include <ATen/ATen.h>

#include <chrono>
#include <limits>
#include <thread>

#include "dstrain/core/fault_injector.h"
#include "dstrain/train/data_plan.h"
#include "dstrain/train/telemetry.h"

namespace dstrain::train {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

void FaultObserver::before_micro(size_t micro) {
  started_ = now_s();
  if (micro == 0) std::this_thread::sleep_for(std::chrono::duration<double>(faults_.stall_seconds(rank_, step_ + 1)));
}

at::Tensor FaultObserver::on_loss(size_t micro, const at::Tensor& loss) {
  if (micro == 0 && faults_.nan_loss_due(rank_, step_ + 1)) return loss * std::numeric_limits<double>::quiet_NaN();
  return loss;
}

void FaultObserver::after_backward(size_t) {
  // A slowed rank (DSTRAIN_FAULT_SLOWDOWN) computes `slowdown` times as long: its sleep counts as compute.
  const double slowdown = faults_.slowdown(rank_);
  if (slowdown > 1.0) std::this_thread::sleep_for(std::chrono::duration<double>((now_s() - started_) * (slowdown - 1.0)));
}

void ComputeTimes::timed(size_t, const MicroTiming& timing) {
  telemetry_.add_forward(timing.forward_ms);
  if (timing.issue_ms >= 0) telemetry_.add_issue(timing.issue_ms);
  telemetry_.add_backward(timing.backward_ms);
  balancer_.add_compute((timing.forward_ms + timing.backward_ms) / 1000.0, timing.rows);
}

}  // namespace dstrain::train
