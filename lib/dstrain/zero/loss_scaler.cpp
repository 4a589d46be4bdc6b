#include "dstrain/zero/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dstrain/core/error.h"

namespace dstrain::zero {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  state_.scale = dynamic() ? std::ldexp(1.0, static_cast<int>(config.initial_scale_power)) : config.static_scale;
  state_.hysteresis_left = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic()) {
    ++state_.iter;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale == config_.min_scale)
        throw Error(ErrorCode::kDiverged,
                    fmt::format("fp16 gradients overflowed at the minimum loss scale {} (step {}): training has diverged",
                                config_.min_scale, state_.iter),
                    "lower the learning rate, use bf16 (precision.dtype: bf16), or resume from an earlier checkpoint");
      state_.scale = std::max(state_.scale / 2, config_.min_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iter = state_.iter;
  } else {
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    const int64_t stable = state_.iter - state_.last_overflow_iter - 1;
    if (stable > 0 && stable % config_.window == 0) {
      if (!config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2;
    }
  }
  ++state_.iter;
}

}  // namespace dstrain::zero
