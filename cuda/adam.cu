// The fused Adam/AdamW step on the GPU: DeepSpeedCPUAdam's per-element math (the same as
// lib/dstrain/optim/cpu_adam.cpp), one pass over p, g, m, v with the loss-scale removal and
// clipping factor folded in. And the fp16 overflow check: unscale in place and raise a flag when
// any element is inf or nan (the flag is only ever set, so one flag serves several buffers).
#include <cuda_runtime.h>

#include <cmath>

#include "dstrain_cuda.h"

namespace {

constexpr int kThreads = 256;

// The coefficients are cpu_adam.cpp's: step_size = -lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t),
// decay_factor = 1 - lr * wd (AdamW) or 1, l2 = wd (Adam) or 0.
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, size_t n,
                            float b1, float b2, float eps, float step_size, float inv_sqrt_bc2, float decay_factor, float l2, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float param = p[i];
    const float grad = g[i] * scale + l2 * param;
    const float mi = b1 * m[i] + (1.0f - b1) * grad;
    const float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    p[i] = param * decay_factor + step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void unscale_kernel(float* __restrict__ g, size_t n, float inv_scale, int* found_inf) {
  bool bad = false;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = g[i] * inv_scale;
    bad |= !isfinite(x);
    g[i] = x;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1;
}

int blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b > 4096 ? 4096 : (b == 0 ? 1 : b));
}

}  // namespace

extern "C" int dstrain_cuda_adam_f32(float* p, const float* g, float* m, float* v, size_t n, const DstrainAdamParams* h, float grad_scale,
                                     void* stream) {
  if (n == 0) return 0;
  const double bc1 = 1.0 - std::pow(h->beta1, static_cast<double>(h->step));
  const double bc2 = 1.0 - std::pow(h->beta2, static_cast<double>(h->step));
  adam_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p, g, m, v, n, static_cast<float>(h->beta1), static_cast<float>(h->beta2), static_cast<float>(h->eps),
      static_cast<float>(-h->lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
      static_cast<float>(h->adamw ? 1.0 - h->lr * h->weight_decay : 1.0), static_cast<float>(h->adamw ? 0.0 : h->weight_decay), grad_scale);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int dstrain_cuda_unscale_found_inf_f32(float* g, size_t n, float inv_scale, int* found_inf, void* stream) {
  if (n == 0) return 0;
  unscale_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, n, inv_scale, found_inf);
  return static_cast<int>(cudaGetLastError());
}
