#pragma once
// fp16 loss scaling, DeepSpeed's ZeRO DynamicLossScaler exactly (runtime/fp16/loss_scaler.py):
// the scale halves after `hysteresis` overflows (never below min_scale; an overflow at the
// minimum is fatal), and doubles after `window` clean steps since the last overflow. A static
// scale (loss_scale > 0) never changes; overflowing steps are still skipped.
#include <cstdint>

namespace dstrain::zero {

struct LossScalerConfig {
  double static_scale = 0;  // > 0: static
  int64_t initial_scale_power = 16;
  int64_t window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_scale = 1;
};

// The whole state, saved with checkpoints so that a resume continues the same trajectory.
struct LossScalerState {
  double scale = 1;
  int64_t iter = 0;
  int64_t last_overflow_iter = -1;
  int64_t hysteresis_left = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);
  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.static_scale <= 0; }
  // Once per optimizer step, after the overflow check. Throws Error{kDiverged} when an
  // overflow happens at the minimum scale with no hysteresis left (DeepSpeed exits there too).
  void update(bool overflow);
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace dstrain::zero
