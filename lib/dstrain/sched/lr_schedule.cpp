#include "dstrain/sched/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dstrain/config/recipe.h"

namespace dstrain::sched {
namespace {

// DeepSpeed's warmup fraction for iteration `it` of N warmup steps.
double ds_warmup_fraction(const LrSchedule& s, int64_t it, double n) {
  const double x = static_cast<double>(it);
  return s.log_warmup ? std::log(x + 1) / std::log(n) : x / n;
}

// OneCycle's position in the cycle for DeepSpeed iteration `it`: 0 at the ends, 1 at the peak.
double one_cycle_scale(const LrSchedule::OneCycle& c, int64_t it) {
  const double total = static_cast<double>(c.first + c.second);
  const double b = static_cast<double>(it + 1);
  const double x = 1.0 + b / total - std::floor(1.0 + b / total);
  const double ratio = static_cast<double>(c.first) / total;
  return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

// Decay intervals after the cycle (0 when decay is off).
double one_cycle_decay_intervals(const LrSchedule::OneCycle& c, int64_t it) {
  if (c.decay_step_size <= 0) return 0;
  return static_cast<double>(it - (c.first + c.second) + 1) / static_cast<double>(c.decay_step_size);
}

}  // namespace

Betas betas_at(const LrSchedule& s, int64_t step) {
  if (s.type != ScheduleType::kDsOneCycle || !s.cycle.momentum) return {};
  const auto& c = s.cycle;
  const int64_t it = step - 1;
  if (it < c.first + c.second) return {c.max_mom - (c.max_mom - c.min_mom) * one_cycle_scale(c, it), 0.99};
  return {c.max_mom * (1.0 + c.decay_mom_rate * one_cycle_decay_intervals(c, it)), 0.99};
}

LrSchedule lr_schedule_from(const config::Recipe& r) {
  const auto& s = r.schedule;
  LrSchedule out;
  out.type = s.type;
  out.peak_lr = r.optimizer.lr;
  out.warmup_steps = s.warmup_steps;
  out.total_steps = r.train.steps;
  out.log_warmup = s.warmup_type == config::WarmupType::kLog;
  out.warmup_min_ratio = s.warmup_min_ratio;
  out.min_ratio = s.min_lr_ratio;
  out.decay_ratio = s.decay_ratio;
  out.cycle = {s.cycle_min_lr,          s.cycle_max_lr > 0 ? s.cycle_max_lr : r.optimizer.lr,
               s.cycle_first_step_size, s.cycle_second_step_size > 0 ? s.cycle_second_step_size : s.cycle_first_step_size,
               s.decay_lr_rate,         s.decay_step_size,
               s.cycle_momentum,        s.cycle_min_mom,
               s.cycle_max_mom,         s.decay_mom_rate};
  return out;
}

std::string describe_lr(const config::Recipe& r) {
  const LrSchedule s = lr_schedule_from(r);
  const int64_t total = std::max<int64_t>(r.train.steps, 1);
  std::vector<int64_t> steps{1};  // 1-based
  if (s.warmup_steps > 1 && s.warmup_steps < total) steps.push_back(s.warmup_steps);
  if (total / 2 > steps.back()) steps.push_back(total / 2);
  if (total > steps.back()) steps.push_back(total);
  std::vector<std::string> points;
  for (const int64_t step : steps)
    points.push_back(fmt::format("{:.3g} at step {}", lr_at(s, step - 1) * batch_lr_factor(r, step - 1), step));
  return fmt::format("{}: {}", config::name(s.type), fmt::join(points, ", "));
}

double batch_lr_factor(const config::Recipe& r, int64_t step) {
  const double ratio = static_cast<double>(config::global_batch_at(r, step)) / static_cast<double>(config::global_batch_at(r, 0));
  if (r.schedule.batch_scaling == config::BatchScaling::kLinear) return ratio;
  if (r.schedule.batch_scaling == config::BatchScaling::kSqrt) return std::sqrt(ratio);
  return 1.0;
}

double lr_at(const LrSchedule& s, int64_t step) {
  switch (s.type) {
    case ScheduleType::kConstant:
      return s.peak_lr;
    case ScheduleType::kWarmupCosine: {
      if (s.warmup_steps > 0 && step < s.warmup_steps) {
        const double w = static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
        return s.peak_lr * (s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * w);
      }
      const int64_t decay_steps = s.total_steps - s.warmup_steps;
      if (decay_steps <= 0) return s.peak_lr;
      const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay_steps));
      return s.peak_lr * (s.min_ratio + (1.0 - s.min_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
    case ScheduleType::kWsd: {
      if (s.warmup_steps > 0 && step < s.warmup_steps)
        return s.peak_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
      const int64_t decay_steps = static_cast<int64_t>(std::llround(s.decay_ratio * static_cast<double>(s.total_steps)));
      const int64_t decay_start = std::max(s.warmup_steps, s.total_steps - decay_steps);
      if (step < decay_start || decay_steps <= 0) return s.peak_lr;
      // Linear from the peak at decay_start to peak*min_ratio at the last step.
      const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - 1 - decay_start));
      const double progress = std::min(1.0, static_cast<double>(step - decay_start) / span);
      return s.peak_lr * (1.0 - (1.0 - s.min_ratio) * progress);
    }
    case ScheduleType::kDsOneCycle: {
      const auto& c = s.cycle;
      const int64_t it = step - 1;
      if (it < c.first + c.second) return c.min_lr + (c.max_lr - c.min_lr) * one_cycle_scale(c, it);
      return c.min_lr / (1.0 + c.decay_lr_rate * one_cycle_decay_intervals(c, it));
    }
    case ScheduleType::kDsWarmup:
    case ScheduleType::kDsWarmupDecay: {
      const int64_t it = step - 1;
      const double min_lr = s.peak_lr * s.warmup_min_ratio;
      if (it < 0) return min_lr;
      const double n = std::max<double>(2.0, static_cast<double>(s.warmup_steps));
      double gamma = 1.0;
      if (static_cast<double>(it) < n)
        gamma = ds_warmup_fraction(s, it, n);
      else if (s.type == ScheduleType::kDsWarmupDecay)
        gamma = std::max(0.0, static_cast<double>(s.total_steps - it) / std::max(1.0, static_cast<double>(s.total_steps) - n));
      return min_lr + (s.peak_lr - min_lr) * gamma;
    }
    case ScheduleType::kDsWarmupCosine: {
      const int64_t it = step - 1;
      if (it < 0) return 0.0;
      const double n = static_cast<double>(s.warmup_steps);
      double ratio;
      if (static_cast<double>(it) < n) {
        ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * ds_warmup_fraction(s, it, std::max(2.0, n));
      } else {
        const double p = std::min(1.0, (static_cast<double>(it) - n + 1) / std::max(1.0, static_cast<double>(s.total_steps) - n));
        ratio = std::max(0.0, s.min_ratio + (1.0 - s.min_ratio) * (1.0 + std::cos(M_PI * p)) / 2.0);
      }
      return s.peak_lr * ratio;
    }
  }
  return s.peak_lr;
}

}  // namespace dstrain::sched
