#pragma once
// Learning-rate schedules as pure functions of the optimizer step, so resume needs no scheduler
// state beyond the step itself.
#include <cstdint>
#include <string>

#include "dstrain/config/enums.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::sched {

using config::ScheduleType;

struct LrSchedule {
  ScheduleType type = ScheduleType::kWarmupCosine;
  double peak_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  bool log_warmup = false;  // ds_* types: ln(it+1)/ln(N) instead of it/N
  double warmup_min_ratio = 0;
  double min_ratio = 0;
  double decay_ratio = 0.1;  // wsd
  struct OneCycle {
    double min_lr = 0, max_lr = 0;
    int64_t first = 2000, second = 2000;
    double decay_lr_rate = 0;
    int64_t decay_step_size = 0;
    bool momentum = true;
    double min_mom = 0.8, max_mom = 0.9, decay_mom_rate = 0;
  } cycle;
};

// The recipe's schedule (its schedule section, optimizer.lr and train.steps).
LrSchedule lr_schedule_from(const config::Recipe& recipe);
// schedule.batch_scaling: the LR factor at `step` (0-based) when staged accumulation makes its
// global batch differ from the first step's (1 without scaling).
double batch_lr_factor(const config::Recipe& recipe, int64_t step);

// LR for optimizer step `step` (0-based). The DeepSpeed types use DeepSpeed's iteration counter
// it = step - 1 (its scheduler sets the first step's LR at construction, with it = -1).
double lr_at(const LrSchedule& s, int64_t step);

// The LR the run will follow, for --dry-run: a line with the LR at the first step, the end of
// the warmup, the middle and the last step (1-based steps, as the metrics count them).
std::string describe_lr(const config::Recipe& recipe);

// Adam's (beta1, beta2) for the step when the schedule cycles momentum (ds_one_cycle), else
// {-1, -1}: keep the optimizer's.
struct Betas {
  double beta1 = -1, beta2 = -1;
};
Betas betas_at(const LrSchedule& s, int64_t step);

}  // namespace dstrain::sched
