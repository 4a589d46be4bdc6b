#include "catch_torch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
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

namespace {
at::ScalarType scalar_type_of(AdamElem e) {
  return e == AdamElem::kBFloat16 ? at::kBFloat16 : e == AdamElem::kHalf ? at::kHalf : at::kFloat;
}
// Bitwise equality, NaNs included (as raw bytes).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.numel() * a.element_size())) == 0;
}
}  // namespace

TEST_CASE("mixed Adam: 16-bit gradients in, the 16-bit model copy out, one pass, bit-identical to widening first and converting after",
          "[optim]") {
  for (AdamIsa isa : adam_isas()) {
    for (AdamElem elem : {AdamElem::kBFloat16, AdamElem::kHalf, AdamElem::kFloat}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{40000}}) {
        INFO("isa " << adam_isa_name(isa) << ", dtype " << scalar_type_of(elem) << ", n " << n);
        at::manual_seed(static_cast<uint64_t>(n));
        const at::Tensor g16 = (at::randn({n}) * 0.1).to(scalar_type_of(elem));
        const at::Tensor wide = g16.to(at::kFloat);
        at::Tensor p = at::randn({n}), m = at::randn({n}) * 0.01, v = at::rand({n}) * 1e-3;
        at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
        at::Tensor out = at::full({n}, 7.0).to(scalar_type_of(elem));
        for (bool adamw : {true, false}) {
          const AdamHyper h{1e-3, 0.9, 0.95, 1e-8, 0.1, adamw, adamw ? 3 : 4};
          fused_adam_mixed_on(isa, p.data_ptr<float>(), g16.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr(), elem, n,
                              h, 0.5f);
          fused_adam_mixed_on(isa, p2.data_ptr<float>(), wide.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), nullptr,
                              AdamElem::kFloat, n, h, 0.5f);
          CHECK(same_bits(p, p2));
          CHECK(same_bits(m, m2));
          CHECK(same_bits(v, v2));
          CHECK(same_bits(out, p2.to(scalar_type_of(elem))));
        }
      }
    }
  }
}

TEST_CASE("mixed Adam rounds the model copy as ATen does: ties to even, overflow, subnormals, NaN", "[optim]") {
  // lr 0 and no decay leave p as it is, so the copy is the conversion of the values below.
  const std::vector<float> specials{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 3.0e38f,      -3.4e38f, 65504.0f,
                                    65519.0f,       65520.0f,           1e-40f,          -1e-45f,      3e-8f,    6e-5f,
                                    0.0f,           1.0f + 0x1p-11f,    2049.0f,         std::nanf("")};
  std::vector<float> values;
  for (int i = 0; i < 5; ++i) values.insert(values.end(), specials.begin(), specials.end());  // vector lanes and the tail
  values.pop_back();
  const auto n = static_cast<int64_t>(values.size());
  for (AdamIsa isa : adam_isas()) {
    for (AdamElem elem : {AdamElem::kBFloat16, AdamElem::kHalf}) {
      INFO("isa " << adam_isa_name(isa) << ", dtype " << scalar_type_of(elem));
      at::Tensor p = at::tensor(values), g = at::zeros({n}, scalar_type_of(elem)), m = at::zeros({n}), v = at::zeros({n});
      at::Tensor out = at::zeros({n}, scalar_type_of(elem));
      fused_adam_mixed_on(isa, p.data_ptr<float>(), g.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr(), elem, n,
                          {0.0, 0.9, 0.95, 1e-8, 0.0, true, 1});
      const at::Tensor want = at::tensor(values).to(scalar_type_of(elem));
      const at::Tensor nan = at::isnan(want);
      CHECK(at::equal(at::isnan(out), nan));
      // Bitwise outside the NaNs (a NaN's payload is the hardware's); the kept values are exact.
      CHECK(same_bits(out.masked_fill(nan, 0), want.masked_fill(nan, 0)));
    }
  }
}

TEST_CASE("the norm's sum of squares: double-precision sums on every instruction set, inf and nan kept", "[optim]") {
  for (AdamIsa isa : adam_isas()) {
    for (AdamElem elem : {AdamElem::kBFloat16, AdamElem::kHalf, AdamElem::kFloat}) {
      for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{31}, int64_t{33}, int64_t{65536}}) {
        INFO("isa " << adam_isa_name(isa) << ", dtype " << scalar_type_of(elem) << ", n " << n);
        at::manual_seed(static_cast<uint64_t>(n) + 1);
        at::Tensor g = (at::randn({n}) * 3).to(scalar_type_of(elem));
        const double want = g.to(at::kDouble).pow(2).sum().item<double>();
        CHECK(sum_squares_on(isa, g.data_ptr(), elem, n) == Approx(want).epsilon(1e-13));
        if (n == 0) continue;
        for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
          at::Tensor with_bad = g.clone();
          with_bad[n - 1] = bad;
          CHECK(!std::isfinite(sum_squares_on(isa, with_bad.data_ptr(), elem, n)));
        }
      }
    }
  }
}

TEST_CASE("mixed Adam may write the model copy over the gradients it reads (the offload path's staging)", "[optim]") {
  const int64_t n = 40001;
  for (AdamIsa isa : adam_isas()) {
    INFO("isa " << adam_isa_name(isa));
    at::manual_seed(5);
    at::Tensor g = (at::randn({n}) * 0.1).to(at::kBFloat16), p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
    at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone(), out = at::empty({n}, at::kBFloat16);
    const AdamHyper h{1e-3, 0.9, 0.95, 1e-8, 0.1, true, 1};
    fused_adam_mixed_on(isa, p2.data_ptr<float>(), g.data_ptr(), m2.data_ptr<float>(), v2.data_ptr<float>(), out.data_ptr(),
                        AdamElem::kBFloat16, n, h);
    fused_adam_mixed_on(isa, p.data_ptr<float>(), g.data_ptr(), m.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr(), AdamElem::kBFloat16,
                        n, h);
    CHECK(same_bits(p, p2));
    CHECK(same_bits(g, out));
  }
}
