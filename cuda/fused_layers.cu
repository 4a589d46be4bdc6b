// Element-wise layers of the model fused into one pass each way (issue 21): SwiGLU's
// silu(gate) * up, and rotary embeddings on [B, T, heads, dim] rows. Math in fp32, one rounding
// to the element type at the end; the same formulas as the composite ATen code in
// lib/dstrain/model/layers.cpp (which the GPU tests compare against).
#include <cuda_runtime.h>

#include <type_traits>

#include "dstrain_cuda.h"
#include "elem.cuh"

namespace {

using dstrain_cuda::Elem;
constexpr int kThreads = 256;

int blocks_for(long long n) {
  const long long b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b > 65535 * 8 ? 65535 * 8 : (b == 0 ? 1 : b));
}

#define GRID_STRIDE(i, n)                                                                    \
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<long long>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void swiglu_forward(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out, long long n) {
  GRID_STRIDE(i, n) {
    const float g = Elem<T>::load(gate, i);
    const float s = 1.0f / (1.0f + __expf(-g));
    out[i] = Elem<T>::to(g * s * Elem<T>::load(up, i));
  }
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g).
template <typename T>
__global__ void swiglu_backward(const T* __restrict__ grad, const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ grad_gate,
                                T* __restrict__ grad_up, long long n) {
  GRID_STRIDE(i, n) {
    const float g = Elem<T>::load(gate, i), d = Elem<T>::load(grad, i);
    const float s = 1.0f / (1.0f + __expf(-g));
    grad_gate[i] = Elem<T>::to(d * Elem<T>::load(up, i) * s * (1.0f + g * (1.0f - s)));
    grad_up[i] = Elem<T>::to(d * g * s);
  }
}

// Rows of `dim` elements, row r at position t = (r / heads) % seq: out[i] = x[i] cos[t, i] +
// rotate_half(x)[i] sin[t, i], rotate_half(x) = (-x[half:], x[:half]). Backward (transpose):
// grad_x[i] = g[i] cos[t, i] + (i < half ? g[i + half] sin[t, i + half] : -g[i - half] sin[t, i - half]).
template <typename T, bool kBackward>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin, T* __restrict__ out,
                            long long rows, int heads, int seq, int dim) {
  const int half = dim / 2;
  const long long n = rows * dim;
  GRID_STRIDE(e, n) {
    const long long row = e / dim;
    const int i = static_cast<int>(e - row * dim);
    const long long t = (row / heads) % seq;
    const T* c = cos + t * dim;
    const T* s = sin + t * dim;
    const T* xr = x + row * dim;
    float y = Elem<T>::load(xr, i) * Elem<T>::load(c, i);
    if (!kBackward)
      y += (i < half ? -Elem<T>::load(xr, i + half) : Elem<T>::load(xr, i - half)) * Elem<T>::load(s, i);
    else
      y += i < half ? Elem<T>::load(xr, i + half) * Elem<T>::load(s, i + half) : -Elem<T>::load(xr, i - half) * Elem<T>::load(s, i - half);
    out[e] = Elem<T>::to(y);
  }
}

template <typename F>
int dispatch(int elem, F&& f) {
  switch (elem) {
    case DSTRAIN_ELEM_F32:
      f(static_cast<float*>(nullptr));
      break;
    case DSTRAIN_ELEM_BF16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      break;
    case DSTRAIN_ELEM_F16:
      f(static_cast<__half*>(nullptr));
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int dstrain_cuda_swiglu_forward(const void* gate, const void* up, void* out, long long n, int elem, void* stream) {
  if (n <= 0) return 0;
  return dispatch(elem, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_forward<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
  });
}

extern "C" int dstrain_cuda_swiglu_backward(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up, long long n,
                                            int elem, void* stream) {
  if (n <= 0) return 0;
  return dispatch(elem, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    swiglu_backward<T><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(grad), static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(grad_gate),
        static_cast<T*>(grad_up), n);
  });
}

extern "C" int dstrain_cuda_rope(const void* x, const void* cos, const void* sin, void* out, long long rows, int heads, int seq, int dim,
                                 int backward, int elem, void* stream) {
  if (rows <= 0) return 0;
  if (dim % 2 != 0 || heads <= 0 || seq <= 0) return static_cast<int>(cudaErrorInvalidValue);
  return dispatch(elem, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto* args = static_cast<const T*>(x);
    const int blocks = blocks_for(rows * dim);
    if (backward)
      rope_kernel<T, true><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args, static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(out), rows, heads, seq, dim);
    else
      rope_kernel<T, false><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args, static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(out), rows, heads, seq, dim);
  });
}
