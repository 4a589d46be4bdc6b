#pragma once
// The fused CPU Adam/AdamW kernel (DeepSpeedCPUAdam's per-element math): one pass over p, g, m, v
// with AVX-512 or AVX2+FMA chosen at run time, split across threads with ATen's parallel_for
// (OpenMP in LibTorch). Used for every CPU optimizer step and for offload_optimizer: cpu.
#include <cstdint>
#include <string>

namespace dstrain::optim {

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adamw = true;  // decoupled decay; false: Adam with L2 decay added to the gradient
  int64_t step = 1;   // 1-based, for bias correction
};

// Per element: g *= grad_scale; (Adam) g += wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
// (AdamW) p -= lr*wd*p; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
// grad_scale folds loss-scale removal and clipping into the same pass. weight_decay = 0 for
// segments that must not decay.
void fused_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale = 1.0f);

// "avx512", "avx2" or "scalar": what fused_adam uses on this CPU. DSTRAIN_CPU_ADAM_ISA forces a
// lower one (for tests and benchmarks).
std::string fused_adam_isa();

// The same math one element at a time in double precision: the reference in tests.
void reference_adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale = 1.0f);

}  // namespace dstrain::optim
