#include <catch2/catch.hpp>

#include <cmath>

#include "dstrain/sched/lr_schedule.h"

using dstrain::sched::lr_at;
using dstrain::sched::WarmupCosine;

TEST_CASE("warmup is linear up to the peak", "[sched]") {
  const WarmupCosine s{1.0, 10, 110, 0.1};
  CHECK(lr_at(s, 0) == Approx(0.1));
  CHECK(lr_at(s, 4) == Approx(0.5));
  CHECK(lr_at(s, 9) == Approx(1.0));
}

TEST_CASE("cosine decays from the peak to min_lr_ratio", "[sched]") {
  const WarmupCosine s{2.0, 10, 110, 0.1};
  CHECK(lr_at(s, 10) == Approx(2.0));
  CHECK(lr_at(s, 60) == Approx(2.0 * (0.1 + 0.9 * 0.5)));  // halfway: cos = 0
  CHECK(lr_at(s, 110) == Approx(0.2));
  CHECK(lr_at(s, 500) == Approx(0.2));  // constant after the end
  for (int64_t step = 10; step < 110; ++step) CHECK(lr_at(s, step + 1) <= lr_at(s, step));
}

TEST_CASE("no warmup and no decay", "[sched]") {
  CHECK(lr_at({0.5, 0, 100, 0.0}, 0) == Approx(0.5));
  CHECK(lr_at({0.5, 0, 100, 0.0}, 100) == Approx(0.0).margin(1e-12));
  CHECK(lr_at({0.5, 10, 10, 0.0}, 50) == Approx(0.5));
}
