// The optimizer step over flat buffers, one launch per phase for the whole model: a table of
// pieces (at most 65,536 elements of one parameter run each; one thread block per piece) names
// each piece's fp32 state, its gradient in the model dtype and the model-dtype copy to write.
// No per-tensor launches and no fp32 copy of the gradients: they are read in the model dtype.
// The gradient norm is summed per piece, then over pieces in a fixed order (deterministic).
#include <cuda_runtime.h>

#include <cmath>

#include "dstrain_cuda.h"
#include "elem.cuh"

namespace {

using dstrain_cuda::Elem;
constexpr int kThreads = 256;

// Sums a block's per-thread values in shared memory (fixed tree order); thread 0 gets the total.
__device__ double block_sum(double value) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  return partial[0];
}

template <typename T>
__global__ void __launch_bounds__(kThreads) piece_sum_squares(const DstrainStepPiece* __restrict__ pieces, double* __restrict__ partials) {
  const T* g = static_cast<const T*>(pieces[blockIdx.x].grad);
  const long long n = pieces[blockIdx.x].n;
  double acc = 0.0;
  for (long long i = threadIdx.x; i < n; i += kThreads) {
    const double x = Elem<T>::load(g, i);
    acc += x * x;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) sum_partials(const double* __restrict__ partials, int n, double* __restrict__ out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = total;
}

// adam.cu's per-element math; decay_factor and l2 apply only to pieces that decay.
template <typename T>
__global__ void __launch_bounds__(kThreads) piece_adam(const DstrainStepPiece* __restrict__ pieces, float b1, float b2, float eps,
                                                       float step_size, float inv_sqrt_bc2, float decay_factor, float l2, float scale) {
  const DstrainStepPiece pc = pieces[blockIdx.x];
  const float df = pc.decay ? decay_factor : 1.0f;
  const float wd = pc.decay ? l2 : 0.0f;
  for (long long i = threadIdx.x; i < pc.n; i += kThreads) {
    const float param = pc.master[i];
    const float grad = Elem<T>::load(static_cast<const T*>(pc.grad), i) * scale + wd * param;
    const float mi = b1 * pc.exp_avg[i] + (1.0f - b1) * grad;
    const float vi = b2 * pc.exp_avg_sq[i] + (1.0f - b2) * grad * grad;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    const float updated = param * df + step_size * mi / denom;
    pc.master[i] = updated;
    pc.exp_avg[i] = mi;
    pc.exp_avg_sq[i] = vi;
    if (pc.param_out) static_cast<T*>(pc.param_out)[i] = Elem<T>::to(updated);
  }
}

template <typename T>
int launch_sum_squares(const DstrainStepPiece* pieces, int num_pieces, double* partials, double* out, cudaStream_t s) {
  piece_sum_squares<T><<<num_pieces, kThreads, 0, s>>>(pieces, partials);
  sum_partials<<<1, kThreads, 0, s>>>(partials, num_pieces, out);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int launch_adam(const DstrainStepPiece* pieces, int num_pieces, const DstrainAdamParams* h, float scale, cudaStream_t s) {
  const double bc1 = 1.0 - std::pow(h->beta1, static_cast<double>(h->step));
  const double bc2 = 1.0 - std::pow(h->beta2, static_cast<double>(h->step));
  piece_adam<T><<<num_pieces, kThreads, 0, s>>>(
      pieces, static_cast<float>(h->beta1), static_cast<float>(h->beta2), static_cast<float>(h->eps), static_cast<float>(-h->lr / bc1),
      static_cast<float>(1.0 / std::sqrt(bc2)), static_cast<float>(h->adamw ? 1.0 - h->lr * h->weight_decay : 1.0),
      static_cast<float>(h->adamw ? 0.0 : h->weight_decay), scale);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int dstrain_cuda_step_sum_squares(const DstrainStepPiece* pieces, int num_pieces, int elem, double* partials, double* out,
                                             void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (num_pieces <= 0) return static_cast<int>(cudaMemsetAsync(out, 0, sizeof(double), s));
  switch (elem) {
    case DSTRAIN_ELEM_F32:
      return launch_sum_squares<float>(pieces, num_pieces, partials, out, s);
    case DSTRAIN_ELEM_BF16:
      return launch_sum_squares<__nv_bfloat16>(pieces, num_pieces, partials, out, s);
    case DSTRAIN_ELEM_F16:
      return launch_sum_squares<__half>(pieces, num_pieces, partials, out, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

extern "C" int dstrain_cuda_step_adam(const DstrainStepPiece* pieces, int num_pieces, int elem, const DstrainAdamParams* h,
                                      float grad_scale, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (num_pieces <= 0) return 0;
  switch (elem) {
    case DSTRAIN_ELEM_F32:
      return launch_adam<float>(pieces, num_pieces, h, grad_scale, s);
    case DSTRAIN_ELEM_BF16:
      return launch_adam<__nv_bfloat16>(pieces, num_pieces, h, grad_scale, s);
    case DSTRAIN_ELEM_F16:
      return launch_adam<__half>(pieces, num_pieces, h, grad_scale, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}
