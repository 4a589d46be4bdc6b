#include "dstrain/sched/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace dstrain::sched {

double lr_at(const WarmupCosine& s, int64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return s.peak_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const int64_t decay_steps = s.total_steps - s.warmup_steps;
  if (decay_steps <= 0) return s.peak_lr;
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return s.peak_lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine);
}

}  // namespace dstrain::sched
