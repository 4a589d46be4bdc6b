#pragma once
// Learning-rate schedules as pure functions of the step, so resume needs no scheduler state
// beyond the step itself.
#include <cstdint>

namespace dstrain::sched {

struct WarmupCosine {
  double peak_lr;
  int64_t warmup_steps;
  int64_t total_steps;
  double min_lr_ratio;  // the cosine ends at peak_lr * min_lr_ratio
};

// LR for optimizer step `step` (0-based): linear warmup from peak/warmup to peak over
// warmup_steps, then cosine decay to peak*min_lr_ratio at total_steps, constant after.
double lr_at(const WarmupCosine& s, int64_t step);

}  // namespace dstrain::sched
