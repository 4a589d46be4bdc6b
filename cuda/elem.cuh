#pragma once
// Loads and stores of the element types dstrain's kernels read and write (DSTRAIN_ELEM_*):
// fp32 math in registers, one rounding to nearest even on the way out (as ATen rounds).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dstrain_cuda {

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ float load(const float* p, long long i) { return p[i]; }
  static __device__ float to(float x) { return x; }
};
template <>
struct Elem<__nv_bfloat16> {
  static __device__ float load(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
  static __device__ __nv_bfloat16 to(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Elem<__half> {
  static __device__ float load(const __half* p, long long i) { return __half2float(p[i]); }
  static __device__ __half to(float x) { return __float2half_rn(x); }
};

}  // namespace dstrain_cuda
