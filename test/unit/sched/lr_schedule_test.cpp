#include "catch_torch.h"

#include <cmath>

#include "dstrain/sched/lr_schedule.h"

using namespace dstrain::sched;

namespace {
LrSchedule make(ScheduleType type, double peak, int64_t warmup, int64_t total, bool log_warmup = false, double wmin = 0,
                double min_ratio = 0) {
  LrSchedule s;
  s.type = type, s.peak_lr = peak, s.warmup_steps = warmup, s.total_steps = total, s.log_warmup = log_warmup, s.warmup_min_ratio = wmin,
  s.min_ratio = min_ratio;
  return s;
}
}  // namespace

TEST_CASE("warmup_cosine: linear warmup from the first step, cosine to min_lr_ratio", "[sched]") {
  const auto s = make(ScheduleType::kWarmupCosine, 2.0, 10, 110, false, 0.0, 0.1);
  CHECK(lr_at(s, 0) == Approx(0.2));  // (0+1)/10: the first step already learns
  CHECK(lr_at(s, 4) == Approx(1.0));
  CHECK(lr_at(s, 9) == Approx(2.0));
  CHECK(lr_at(s, 10) == Approx(2.0));
  CHECK(lr_at(s, 60) == Approx(2.0 * (0.1 + 0.9 * 0.5)));  // halfway: cos = 0
  CHECK(lr_at(s, 110) == Approx(0.2));
  CHECK(lr_at(s, 500) == Approx(0.2));  // constant after the end
  for (int64_t step = 10; step < 110; ++step) CHECK(lr_at(s, step + 1) <= lr_at(s, step));
  CHECK(lr_at(make(ScheduleType::kWarmupCosine, 1.0, 4, 10, false, 0.5, 0), 0) == Approx(0.5 + 0.5 * 0.25));
}

TEST_CASE("ds_warmup_cosine follows DeepSpeed's WarmupCosineLR, it = step - 1", "[sched]") {
  const auto lin = make(ScheduleType::kDsWarmupCosine, 1.0, 10, 100, false, 0.0, 0.1);
  CHECK(lr_at(lin, 0) == 0.0);  // it = -1
  CHECK(lr_at(lin, 1) == 0.0);  // it = 0: w = 0/10
  CHECK(lr_at(lin, 5) == Approx(0.4));
  CHECK(lr_at(lin, 11) == Approx(0.1 + 0.9 * (1 + std::cos(M_PI / 90)) / 2));  // p = (10-10+1)/90
  CHECK(lr_at(lin, 101) == Approx(0.1));                                       // p clamped at 1
  CHECK(lr_at(lin, 500) == Approx(0.1));
  const auto log = make(ScheduleType::kDsWarmupCosine, 1.0, 10, 100, true, 0.2, 0.0);
  CHECK(lr_at(log, 5) == Approx(0.2 + 0.8 * std::log(5.0) / std::log(10.0)));
  const auto equal = make(ScheduleType::kDsWarmupCosine, 1.0, 10, 10, false, 0.0, 0.0);
  CHECK(std::isfinite(lr_at(equal, 20)));  // total == warmup: no division by zero
}

TEST_CASE("ds_warmup and ds_warmup_decay follow WarmupLR and WarmupDecayLR", "[sched]") {
  const auto warm = make(ScheduleType::kDsWarmup, 1.0, 10, 100, true, 0.1, 0.0);
  CHECK(lr_at(warm, 0) == Approx(0.1));  // it < 0: min lr
  CHECK(lr_at(warm, 1) == Approx(0.1));  // ln(1) = 0
  CHECK(lr_at(warm, 5) == Approx(0.1 + 0.9 * std::log(5.0) / std::log(10.0)));
  CHECK(lr_at(warm, 50) == Approx(1.0));
  const auto one = make(ScheduleType::kDsWarmup, 1.0, 1, 100, false, 0.0, 0.0);  // N = max(2, 1)
  CHECK(lr_at(one, 2) == Approx(0.5));
  const auto decay = make(ScheduleType::kDsWarmupDecay, 1.0, 10, 100, false, 0.0, 0.0);
  CHECK(lr_at(decay, 56) == Approx(0.5));  // it = 55: (100-55)/(100-10)
  CHECK(lr_at(decay, 101) == Approx(0.0));
  CHECK(lr_at(decay, 300) == Approx(0.0));
}

TEST_CASE("constant and names", "[sched]") {
  CHECK(lr_at(make(ScheduleType::kConstant, 0.5, 10, 100), 0) == 0.5);
  ScheduleType type{};
  CHECK(dstrain::config::parse_enum("ds_warmup_decay", type));
  CHECK(type == ScheduleType::kDsWarmupDecay);
  CHECK_FALSE(dstrain::config::parse_enum("onecycle", type));
  CHECK(dstrain::config::name(ScheduleType::kDsOneCycle) == "ds_one_cycle");
}

TEST_CASE("wsd: warmup, stable at the peak, linear decay to min_lr_ratio over the last decay_ratio", "[sched]") {
  LrSchedule s = make(ScheduleType::kWsd, 1.0, 10, 100, false, 0, 0.1);
  s.decay_ratio = 0.2;  // steps 80..99 decay
  CHECK(lr_at(s, 0) == Approx(0.1));
  CHECK(lr_at(s, 9) == Approx(1.0));
  CHECK(lr_at(s, 50) == 1.0);
  CHECK(lr_at(s, 79) == 1.0);
  CHECK(lr_at(s, 80) == 1.0);
  CHECK(lr_at(s, 99) == Approx(0.1));
  CHECK(lr_at(s, 90) == Approx(1.0 - 0.9 * 10.0 / 19.0));
  for (int64_t k = 80; k < 99; ++k) CHECK(lr_at(s, k + 1) < lr_at(s, k));
  CHECK(betas_at(s, 5).beta1 < 0);  // no momentum cycling
}

TEST_CASE("ds_one_cycle follows DeepSpeed's OneCycle: LR up, down, then decay; beta1 inversely", "[sched]") {
  LrSchedule s = make(ScheduleType::kDsOneCycle, 0, 0, 100);
  s.cycle = {0.1, 1.0, 10, 10, 0.5, 5, true, 0.8, 0.9, 0.1};
  // step k uses it = k - 1; b = it + 1 = k; x = k/20 within the cycle; ratio 0.5.
  CHECK(lr_at(s, 0) == Approx(0.1));              // x = 0
  CHECK(lr_at(s, 5) == Approx(0.1 + 0.9 * 0.5));  // x = 0.25 -> s = 0.5
  CHECK(lr_at(s, 10) == Approx(1.0));             // x = 0.5 -> the peak
  CHECK(lr_at(s, 15) == Approx(0.1 + 0.9 * 0.5));
  CHECK(betas_at(s, 10).beta1 == Approx(0.8));
  CHECK(betas_at(s, 0).beta1 == Approx(0.9));
  CHECK(betas_at(s, 0).beta2 == 0.99);
  // After the cycle (it >= 20): lr = min / (1 + rate * (it - 20 + 1) / decay_step_size).
  CHECK(lr_at(s, 21) == Approx(0.1 / (1 + 0.5 * 1 / 5.0)));
  CHECK(lr_at(s, 30) == Approx(0.1 / (1 + 0.5 * 10 / 5.0)));
  CHECK(betas_at(s, 30).beta1 == Approx(0.9 * (1 + 0.1 * 10 / 5.0)));
  s.cycle.decay_step_size = 0;
  CHECK(lr_at(s, 50) == Approx(0.1));
}
