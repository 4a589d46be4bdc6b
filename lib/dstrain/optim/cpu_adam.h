#pragma once
// The fused CPU Adam/AdamW kernel (DeepSpeedCPUAdam's per-element math): one pass over p, g, m, v
// with AVX-512 or AVX2+FMA chosen at run time, split across threads with ATen's parallel_for
// (OpenMP in LibTorch). Used for every CPU optimizer step and for offload_optimizer: cpu. In
// bf16/fp16 training it reads the 16-bit gradients and writes the 16-bit model copy in the same
// pass (widened and rounded in registers), so a step moves 28 bytes per parameter, as in fp32.
// The gradient norm's sum of squares is vectorized the same way.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::optim {

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adamw = true;  // decoupled decay; false: Adam with L2 decay added to the gradient
  int64_t step = 1;   // 1-based, for bias correction
};

// How a gradient array and the model-dtype copy are stored.
enum class AdamElem { kFloat, kBFloat16, kHalf };

// The instruction sets the kernel has, lowest first.
enum class AdamIsa { kScalar, kAvx2, kAvx512 };

// Per element: g *= grad_scale; (Adam) g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
// (AdamW) p -= lr*wd*p; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
// grad_scale folds loss-scale removal and clipping into the same pass. weight_decay = 0 for
// segments that must not decay.
void fused_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale = 1.0f);

// The same update with the gradients stored as `elem` (widened exactly) and, when param_out is
// not null, the updated weights also written there as `elem`, rounded to nearest even exactly as
// ATen converts them. p, m and v come out bit-identical to fused_adam on the widened gradients.
void fused_adam_mixed(float* p, const void* g, float* m, float* v, void* param_out, AdamElem elem, int64_t n, const AdamHyper& h,
                      float grad_scale = 1.0f);
// On a given instruction set (one this CPU has: adam_isas()), for tests and benchmarks.
void fused_adam_mixed_on(AdamIsa isa, float* p, const void* g, float* m, float* v, void* param_out, AdamElem elem, int64_t n,
                         const AdamHyper& h, float grad_scale = 1.0f);

// The gradient norm's part: the sum of the squares of n gradients stored as `elem`, in double
// (each square is exact; the additions run in an order fixed by the instruction set and n), one
// thread. inf or nan when any element is.
double sum_squares(const void* g, AdamElem elem, int64_t n);
double sum_squares_on(AdamIsa isa, const void* g, AdamElem elem, int64_t n);

// The instruction sets this CPU runs, best first; fused_adam uses the first, unless
// DSTRAIN_CPU_ADAM_ISA (avx2 or scalar) forces a lower one.
std::vector<AdamIsa> adam_isas();
std::string adam_isa_name(AdamIsa isa);
// The name of the one fused_adam uses: "avx512", "avx2" or "scalar".
std::string fused_adam_isa();

// The same math one element at a time in double precision: the reference in tests.
void reference_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale = 1.0f);

}  // namespace dstrain::optim
