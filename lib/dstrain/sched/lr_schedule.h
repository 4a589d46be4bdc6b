#pragma once
// Learning-rate schedules as pure functions of the optimizer step, so resume needs no scheduler
// state beyond the step itself.
#include <cstdint>
#include <string>

namespace dstrain::sched {

enum class ScheduleType {
  kWarmupCosine,    // dstrain's: warmup (step+1)/W from warmup_min_ratio, cosine to min_ratio at the end
  kDsWarmupCosine,  // DeepSpeed WarmupCosineLR, formula for formula
  kDsWarmup,        // DeepSpeed WarmupLR
  kDsWarmupDecay,   // DeepSpeed WarmupDecayLR
  kConstant,
  kWsd,             // warmup (step+1)/W, stable at the peak, linear decay over the last decay_ratio
  kDsOneCycle,      // DeepSpeed OneCycle
};

struct Schedule {
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

// Throws std::invalid_argument for an unknown name (the config validated it already).
ScheduleType schedule_type_from_name(const std::string& name);

// LR for optimizer step `step` (0-based). The DeepSpeed types use DeepSpeed's iteration counter
// it = step - 1 (its scheduler sets the first step's LR at construction, with it = -1).
double lr_at(const Schedule& s, int64_t step);

// Adam's (beta1, beta2) for the step when the schedule cycles momentum (ds_one_cycle), else
// {-1, -1}: keep the optimizer's.
struct Betas {
  double beta1 = -1, beta2 = -1;
};
Betas betas_at(const Schedule& s, int64_t step);

}  // namespace dstrain::sched
