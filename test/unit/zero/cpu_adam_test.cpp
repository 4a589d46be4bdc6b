#include "catch_torch.h"

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "dstrain/optim/cpu_adam.h"

using namespace dstrain::optim;

namespace {
struct State {
  std::vector<float> p, g, m, v;
};
State random_state(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = d(rng);
    s.g[i] = d(rng) * 0.1f;
    s.m[i] = d(rng) * 0.01f;
    s.v[i] = std::abs(d(rng)) * 1e-3f;
  }
  return s;
}
// The largest error in units of (1e-5 relative + 1e-7 absolute): fp32 rounding of values that
// may cancel to near zero (m = b1*m + (1-b1)*g with opposite signs).
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / (std::abs(static_cast<double>(b[i])) * 1e-5 + 1e-7) * 1e-5);
  return worst;
}
}  // namespace

TEST_CASE("fused Adam matches the double-precision reference, AdamW and Adam, with tails", "[optim]") {
  INFO("isa " << fused_adam_isa());
  for (bool adamw : {true, false}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{37}, size_t{100003}}) {
      State a = random_state(n, 7), b = a;
      AdamHyper h{1e-3, 0.9, 0.95, 1e-8, 0.1, adamw, 1};
      for (int64_t step = 1; step <= 3; ++step) {
        h.step = step;
        fused_adam(a.p.data(), a.g.data(), a.m.data(), a.v.data(), static_cast<int64_t>(n), h, 0.5f);
        reference_adam(b.p.data(), b.g.data(), b.m.data(), b.v.data(), static_cast<int64_t>(n), h, 0.5f);
      }
      CHECK(max_rel(a.p, b.p) < 1e-5);
      CHECK(max_rel(a.m, b.m) < 1e-5);
      CHECK(max_rel(a.v, b.v) < 1e-5);
    }
  }
}

TEST_CASE("fused Adam: weight decay 0 leaves a zero-gradient parameter in place; decay shrinks it", "[optim]") {
  std::vector<float> p{1.f, -2.f}, g{0.f, 0.f}, m{0.f, 0.f}, v{0.f, 0.f};
  fused_adam(p.data(), g.data(), m.data(), v.data(), 2, {0.1, 0.9, 0.95, 1e-8, 0.0, true, 1});
  CHECK(p == std::vector<float>{1.f, -2.f});
  fused_adam(p.data(), g.data(), m.data(), v.data(), 2, {0.1, 0.9, 0.95, 1e-8, 0.5, true, 2});
  CHECK(p[0] == Approx(0.95f));
  CHECK(p[1] == Approx(-1.9f));
}
