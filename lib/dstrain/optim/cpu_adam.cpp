#include "dstrain/optim/cpu_adam.h"

#include <ATen/Parallel.h>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wmaybe-uninitialized
// reports as a false positive once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdlib>

namespace dstrain::optim {
namespace {

// Constants of one step, computed once (DeepSpeed keeps beta^t incrementally; pow is exact enough).
struct Coeffs {
  float b1, one_minus_b1, b2, one_minus_b2, eps, step_size, inv_sqrt_bc2, decay_factor, l2, scale;
};

Coeffs coeffs_of(const AdamHyper& h, float grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  return {static_cast<float>(h.beta1),
          static_cast<float>(1.0 - h.beta1),
          static_cast<float>(h.beta2),
          static_cast<float>(1.0 - h.beta2),
          static_cast<float>(h.eps),
          static_cast<float>(-h.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(h.adamw ? 1.0 - h.lr * h.weight_decay : 1.0),
          static_cast<float>(h.adamw ? 0.0 : h.weight_decay),
          grad_scale};
}

void scalar_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end, const Coeffs& c) {
  for (int64_t i = begin; i < end; ++i) {
    float grad = g[i] * c.scale;
    grad += c.l2 * p[i];
    m[i] = c.b1 * m[i] + c.one_minus_b1 * grad;
    v[i] = c.b2 * v[i] + c.one_minus_b2 * grad * grad;
    const float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay_factor + c.step_size * m[i] / denom;
  }
}

__attribute__((target("avx2,fma"))) void avx2_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                                                    const Coeffs& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1), omb1 = _mm256_set1_ps(c.one_minus_b1), b2 = _mm256_set1_ps(c.b2),
               omb2 = _mm256_set1_ps(c.one_minus_b2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.step_size), ibc2 = _mm256_set1_ps(c.inv_sqrt_bc2);
  const __m256 decay = _mm256_set1_ps(c.decay_factor), l2 = _mm256_set1_ps(c.l2), scale = _mm256_set1_ps(c.scale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i);
    __m256 grad = _mm256_mul_ps(_mm256_loadu_ps(g + i), scale);
    grad = _mm256_fmadd_ps(l2, pv, grad);
    const __m256 mv = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, grad));
    const __m256 vv = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(omb2, _mm256_mul_ps(grad, grad)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), ibc2, eps);
    pv = _mm256_fmadd_ps(step, _mm256_div_ps(mv, denom), _mm256_mul_ps(pv, decay));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
  }
  scalar_range(p, g, m, v, i, end, c);
}

__attribute__((target("avx512f"))) void avx512_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                                                     const Coeffs& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1), omb1 = _mm512_set1_ps(c.one_minus_b1), b2 = _mm512_set1_ps(c.b2),
               omb2 = _mm512_set1_ps(c.one_minus_b2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size), ibc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  const __m512 decay = _mm512_set1_ps(c.decay_factor), l2 = _mm512_set1_ps(c.l2), scale = _mm512_set1_ps(c.scale);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 pv = _mm512_loadu_ps(p + i);
    __m512 grad = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    grad = _mm512_fmadd_ps(l2, pv, grad);
    const __m512 mv = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, grad));
    const __m512 vv = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(omb2, _mm512_mul_ps(grad, grad)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ibc2, eps);
    pv = _mm512_fmadd_ps(step, _mm512_div_ps(mv, denom), _mm512_mul_ps(pv, decay));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(p + i, pv);
  }
  scalar_range(p, g, m, v, i, end, c);
}

enum class Isa { kScalar, kAvx2, kAvx512 };

Isa detect() {
  Isa best = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (__builtin_cpu_supports("avx512f")) best = Isa::kAvx512;
  if (const char* forced = std::getenv("DSTRAIN_CPU_ADAM_ISA")) {
    const std::string f = forced;
    if (f == "scalar") best = Isa::kScalar;
    if (f == "avx2" && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

}  // namespace

std::string fused_adam_isa() {
  switch (isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

void fused_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale) {
  const Coeffs c = coeffs_of(h, grad_scale);
  const Isa chosen = isa();
  // 64 KiB of each array per task: big enough to amortise the dispatch, small enough to balance.
  constexpr int64_t kGrain = 16384;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    switch (chosen) {
      case Isa::kAvx512:
        avx512_range(p, g, m, v, begin, end, c);
        break;
      case Isa::kAvx2:
        avx2_range(p, g, m, v, begin, end, c);
        break;
      case Isa::kScalar:
        scalar_range(p, g, m, v, begin, end, c);
        break;
    }
  });
}

void reference_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  for (int64_t i = 0; i < n; ++i) {
    double grad = static_cast<double>(g[i]) * grad_scale;
    if (!h.adamw) grad += h.weight_decay * p[i];
    const double mm = h.beta1 * m[i] + (1 - h.beta1) * grad;
    const double vv = h.beta2 * v[i] + (1 - h.beta2) * grad * grad;
    double pp = p[i];
    if (h.adamw) pp *= 1 - h.lr * h.weight_decay;
    pp -= h.lr / bc1 * mm / (std::sqrt(vv) / std::sqrt(bc2) + h.eps);
    m[i] = static_cast<float>(mm);
    v[i] = static_cast<float>(vv);
    p[i] = static_cast<float>(pp);
  }
}

}  // namespace dstrain::optim
