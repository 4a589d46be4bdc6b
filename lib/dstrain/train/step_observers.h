#pragma once
// What the trainer hangs on a step runner (train/step_runner.h):
//   FaultObserver   the fault injector's per-micro-batch faults (DSTRAIN_FAULT_*): a stall
//                   before the first forward, a NaN loss, a slowed rank's extra compute time
//   ComputeTimes    each micro-batch's times into the step's telemetry (forward, backward,
//                   launch overhead) and the shard balancer (samples per second of compute)
#include <cstdint>

#include "dstrain/train/step_runner.h"

namespace dstrain {
class FaultInjector;
}

namespace dstrain::train {

class ShardBalancer;
class Telemetry;

class FaultObserver final : public MicroBatchObserver {
 public:
  // `step`: the trainer's 0-based step being computed (read at each micro-batch).
  FaultObserver(FaultInjector& faults, int rank, const int64_t& step) : faults_(faults), rank_(rank), step_(step) {}
  void before_micro(size_t micro) override;
  at::Tensor on_loss(size_t micro, const at::Tensor& loss) override;
  void after_backward(size_t micro) override;

 private:
  FaultInjector& faults_;
  int rank_;
  const int64_t& step_;
  double started_ = 0;  // steady-clock seconds at the micro-batch's start
};

class ComputeTimes final : public MicroBatchObserver {
 public:
  ComputeTimes(Telemetry& telemetry, ShardBalancer& balancer) : telemetry_(telemetry), balancer_(balancer) {}
  void timed(size_t micro, const MicroTiming& timing) override;

 private:
  Telemetry& telemetry_;
  ShardBalancer& balancer_;
};

}  // namespace dstrain::train
