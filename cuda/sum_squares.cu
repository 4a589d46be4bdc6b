// Sum of squares in double: each block reduces a grid-stride slice in shared memory, then one
// atomicAdd per block. Double accumulation keeps the norm of 1e9-element gradients exact enough
// that clipping decisions match the CPU path.
#include <cuda_runtime.h>

#include "dstrain_cuda.h"

namespace {

constexpr int kThreads = 256;

__global__ void sum_squares_kernel(const float* __restrict__ x, size_t n, double* out) {
  __shared__ double partial[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

}  // namespace

extern "C" int dstrain_cuda_sum_squares_f32(const float* x, size_t n, double* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t rc = cudaMemsetAsync(out, 0, sizeof(double), s);
  if (rc != cudaSuccess) return static_cast<int>(rc);
  if (n == 0) return 0;
  int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  if (blocks > 1024) blocks = 1024;
  sum_squares_kernel<<<blocks, kThreads, 0, s>>>(x, n, out);
  return static_cast<int>(cudaGetLastError());
}
