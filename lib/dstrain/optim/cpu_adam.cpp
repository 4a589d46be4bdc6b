#include "dstrain/optim/cpu_adam.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wmaybe-uninitialized
// reports as a false positive once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdlib>

#include "dstrain/core/error.h"

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

// --- one element at a time (the tails of the vector loops, and CPUs without AVX2) -------------
template <AdamElem E>
inline float load1(const void* g, int64_t i) {
  if constexpr (E == AdamElem::kFloat)
    return static_cast<const float*>(g)[i];
  else if constexpr (E == AdamElem::kBFloat16)
    return static_cast<float>(static_cast<const c10::BFloat16*>(g)[i]);
  else
    return static_cast<float>(static_cast<const c10::Half*>(g)[i]);
}
// Rounded to nearest even, as ATen's conversions do.
template <AdamElem E>
inline void store1(void* out, int64_t i, float x) {
  if constexpr (E == AdamElem::kFloat) static_cast<float*>(out)[i] = x;
  if constexpr (E == AdamElem::kBFloat16) static_cast<c10::BFloat16*>(out)[i] = c10::BFloat16(x);
  if constexpr (E == AdamElem::kHalf) static_cast<c10::Half*>(out)[i] = c10::Half(x);
}

// noinline: the tails round the same way whichever vector loop calls them.
template <AdamElem E, bool Out>
__attribute__((noinline)) void scalar_range(float* p, const void* g, float* m, float* v, void* out, int64_t begin, int64_t end,
                                            const Coeffs& c) {
  for (int64_t i = begin; i < end; ++i) {
    float grad = load1<E>(g, i) * c.scale;
    grad += c.l2 * p[i];
    m[i] = c.b1 * m[i] + c.one_minus_b1 * grad;
    v[i] = c.b2 * v[i] + c.one_minus_b2 * grad * grad;
    const float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * c.decay_factor + c.step_size * m[i] / denom;
    if constexpr (Out) store1<E>(out, i, p[i]);
  }
}

// --- AVX2 + FMA (+ F16C for half), 8 lanes ----------------------------------------------------
#define DSTRAIN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DSTRAIN_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

template <AdamElem E>
DSTRAIN_AVX2_INLINE __m256 load8(const void* g, int64_t i) {
  if constexpr (E == AdamElem::kFloat) {
    return _mm256_loadu_ps(static_cast<const float*>(g) + i);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i));
    if constexpr (E == AdamElem::kBFloat16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    else
      return _mm256_cvtph_ps(raw);
  }
}

// bf16: c10's round_to_nearest_even (add 0x7FFF plus the kept part's lowest bit, keep the high
// half; NaN becomes 0x7FC0), then the 8 halves packed in order.
template <AdamElem E>
DSTRAIN_AVX2_INLINE void store8(void* out, int64_t i, __m256 x) {
  if constexpr (E == AdamElem::kFloat) {
    _mm256_storeu_ps(static_cast<float*>(out) + i, x);
  } else {
    __m128i packed;
    if constexpr (E == AdamElem::kBFloat16) {
      const __m256i u = _mm256_castps_si256(x);
      const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
      __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
      r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
      packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
    } else {
      packed = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i), packed);
  }
}

template <AdamElem E, bool Out>
DSTRAIN_AVX2 void avx2_range(float* p, const void* g, float* m, float* v, void* out, int64_t begin, int64_t end, const Coeffs& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1), omb1 = _mm256_set1_ps(c.one_minus_b1), b2 = _mm256_set1_ps(c.b2),
               omb2 = _mm256_set1_ps(c.one_minus_b2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.step_size), ibc2 = _mm256_set1_ps(c.inv_sqrt_bc2);
  const __m256 decay = _mm256_set1_ps(c.decay_factor), l2 = _mm256_set1_ps(c.l2), scale = _mm256_set1_ps(c.scale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i);
    __m256 grad = _mm256_mul_ps(load8<E>(g, i), scale);
    grad = _mm256_fmadd_ps(l2, pv, grad);
    const __m256 mv = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, grad));
    const __m256 vv = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(omb2, _mm256_mul_ps(grad, grad)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), ibc2, eps);
    pv = _mm256_fmadd_ps(step, _mm256_div_ps(mv, denom), _mm256_mul_ps(pv, decay));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
    if constexpr (Out) store8<E>(out, i, pv);
  }
  scalar_range<E, Out>(p, g, m, v, out, i, end, c);
}

// --- AVX-512, 16 lanes -------------------------------------------------------------------------
#define DSTRAIN_AVX512 __attribute__((target("avx512f")))
#define DSTRAIN_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

template <AdamElem E>
DSTRAIN_AVX512_INLINE __m512 load16(const void* g, int64_t i) {
  if constexpr (E == AdamElem::kFloat) {
    return _mm512_loadu_ps(static_cast<const float*>(g) + i);
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g) + i));
    if constexpr (E == AdamElem::kBFloat16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    else
      return _mm512_cvtph_ps(raw);
  }
}

template <AdamElem E>
DSTRAIN_AVX512_INLINE void store16(void* out, int64_t i, __m512 x) {
  if constexpr (E == AdamElem::kFloat) {
    _mm512_storeu_ps(static_cast<float*>(out) + i, x);
  } else {
    __m256i packed;
    if constexpr (E == AdamElem::kBFloat16) {
      const __m512i u = _mm512_castps_si512(x);
      const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
      r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7FC0));
      packed = _mm512_cvtepi32_epi16(r);
    } else {
      packed = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), packed);
  }
}

template <AdamElem E, bool Out>
DSTRAIN_AVX512 void avx512_range(float* p, const void* g, float* m, float* v, void* out, int64_t begin, int64_t end, const Coeffs& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1), omb1 = _mm512_set1_ps(c.one_minus_b1), b2 = _mm512_set1_ps(c.b2),
               omb2 = _mm512_set1_ps(c.one_minus_b2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size), ibc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  const __m512 decay = _mm512_set1_ps(c.decay_factor), l2 = _mm512_set1_ps(c.l2), scale = _mm512_set1_ps(c.scale);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 pv = _mm512_loadu_ps(p + i);
    __m512 grad = _mm512_mul_ps(load16<E>(g, i), scale);
    grad = _mm512_fmadd_ps(l2, pv, grad);
    const __m512 mv = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, grad));
    const __m512 vv = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(omb2, _mm512_mul_ps(grad, grad)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ibc2, eps);
    pv = _mm512_fmadd_ps(step, _mm512_div_ps(mv, denom), _mm512_mul_ps(pv, decay));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    _mm512_storeu_ps(p + i, pv);
    if constexpr (Out) store16<E>(out, i, pv);
  }
  scalar_range<E, Out>(p, g, m, v, out, i, end, c);
}

// --- the gradient norm's sum of squares: each square exact in double, four double accumulators --
template <AdamElem E>
double scalar_squares(const void* g, int64_t begin, int64_t end) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    const double x0 = load1<E>(g, i), x1 = load1<E>(g, i + 1), x2 = load1<E>(g, i + 2), x3 = load1<E>(g, i + 3);
    a0 += x0 * x0, a1 += x1 * x1, a2 += x2 * x2, a3 += x3 * x3;
  }
  for (; i < end; ++i) {
    const double x = load1<E>(g, i);
    a0 += x * x;
  }
  return (a0 + a1) + (a2 + a3);
}

template <AdamElem E>
DSTRAIN_AVX2 double avx2_squares(const void* g, int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 2; ++k) {
      const __m256 x = load8<E>(g, i + 8 * k);
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      acc[2 * k] = _mm256_fmadd_pd(lo, lo, acc[2 * k]);
      acc[2 * k + 1] = _mm256_fmadd_pd(hi, hi, acc[2 * k + 1]);
    }
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3])));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + scalar_squares<E>(g, i, n);
}

template <AdamElem E>
DSTRAIN_AVX512 double avx512_squares(const void* g, int64_t n) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 2; ++k) {
      const __m512 x = load16<E>(g, i + 16 * k);
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
      const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
      acc[2 * k] = _mm512_fmadd_pd(lo, lo, acc[2 * k]);
      acc[2 * k + 1] = _mm512_fmadd_pd(hi, hi, acc[2 * k + 1]);
    }
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])));
  double total = 0;
  for (double lane : lanes) total += lane;
  return total + scalar_squares<E>(g, i, n);
}

template <AdamElem E>
double squares_on(AdamIsa isa, const void* g, int64_t n) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return avx512_squares<E>(g, n);
    case AdamIsa::kAvx2:
      return avx2_squares<E>(g, n);
    case AdamIsa::kScalar:
      break;
  }
  return scalar_squares<E>(g, 0, n);
}

// --- dispatch ----------------------------------------------------------------------------------
using RangeFn = void (*)(float*, const void*, float*, float*, void*, int64_t, int64_t, const Coeffs&);

template <AdamElem E, bool Out>
RangeFn range_of(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return avx512_range<E, Out>;
    case AdamIsa::kAvx2:
      return avx2_range<E, Out>;
    case AdamIsa::kScalar:
      break;
  }
  return scalar_range<E, Out>;
}

template <AdamElem E>
RangeFn range_of(AdamIsa isa, bool out) {
  return out ? range_of<E, true>(isa) : range_of<E, false>(isa);
}

RangeFn range_of(AdamIsa isa, AdamElem elem, bool out) {
  switch (elem) {
    case AdamElem::kBFloat16:
      return range_of<AdamElem::kBFloat16>(isa, out);
    case AdamElem::kHalf:
      return range_of<AdamElem::kHalf>(isa, out);
    case AdamElem::kFloat:
      break;
  }
  return range_of<AdamElem::kFloat>(isa, out);
}

bool cpu_runs(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case AdamIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case AdamIsa::kScalar:
      break;
  }
  return true;
}

AdamIsa detect() {
  const AdamIsa best = adam_isas().front();
  if (const char* forced = std::getenv("DSTRAIN_CPU_ADAM_ISA")) {
    const std::string f = forced;
    if (f == "scalar") return AdamIsa::kScalar;
    if (f == "avx2" && best == AdamIsa::kAvx512) return AdamIsa::kAvx2;
  }
  return best;
}

AdamIsa chosen_isa() {
  static const AdamIsa chosen = detect();
  return chosen;
}

}  // namespace

std::vector<AdamIsa> adam_isas() {
  std::vector<AdamIsa> out;
  for (AdamIsa isa : {AdamIsa::kAvx512, AdamIsa::kAvx2, AdamIsa::kScalar})
    if (cpu_runs(isa)) out.push_back(isa);
  return out;
}

std::string adam_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAvx512:
      return "avx512";
    case AdamIsa::kAvx2:
      return "avx2";
    case AdamIsa::kScalar:
      break;
  }
  return "scalar";
}

std::string fused_adam_isa() { return adam_isa_name(chosen_isa()); }

void fused_adam_mixed_on(AdamIsa isa, float* p, const void* g, float* m, float* v, void* param_out, AdamElem elem, int64_t n,
                         const AdamHyper& h, float grad_scale) {
  if (!cpu_runs(isa))
    throw Error(ErrorCode::kInternal, "this CPU cannot run the " + adam_isa_name(isa) + " Adam kernel",
                "pick one of optim::adam_isas(); this is a dstrain bug");
  const Coeffs c = coeffs_of(h, grad_scale);
  const RangeFn range = range_of(isa, elem, param_out != nullptr);
  // 64 KiB of each fp32 array per task: big enough to amortise the dispatch, small enough to balance.
  constexpr int64_t kGrain = 16384;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { range(p, g, m, v, param_out, begin, end, c); });
}

void fused_adam_mixed(float* p, const void* g, float* m, float* v, void* param_out, AdamElem elem, int64_t n, const AdamHyper& h,
                      float grad_scale) {
  fused_adam_mixed_on(chosen_isa(), p, g, m, v, param_out, elem, n, h, grad_scale);
}

double sum_squares_on(AdamIsa isa, const void* g, AdamElem elem, int64_t n) {
  if (!cpu_runs(isa))
    throw Error(ErrorCode::kInternal, "this CPU cannot run the " + adam_isa_name(isa) + " norm kernel",
                "pick one of optim::adam_isas(); this is a dstrain bug");
  switch (elem) {
    case AdamElem::kBFloat16:
      return squares_on<AdamElem::kBFloat16>(isa, g, n);
    case AdamElem::kHalf:
      return squares_on<AdamElem::kHalf>(isa, g, n);
    case AdamElem::kFloat:
      break;
  }
  return squares_on<AdamElem::kFloat>(isa, g, n);
}

double sum_squares(const void* g, AdamElem elem, int64_t n) { return sum_squares_on(chosen_isa(), g, elem, n); }

void fused_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale) {
  fused_adam_mixed(p, g, m, v, nullptr, AdamElem::kFloat, n, h, grad_scale);
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
