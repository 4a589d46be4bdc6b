#pragma once
// The CUDA kernels as optimizer_kernels_check.h's backend: device buffers with a poisoned guard.
#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <vector>

#include "catch_torch.h"
#include "dstrain_cuda.h"
#include "optimizer_kernels_check.h"

namespace dstrain::test {

struct CudaKernels {
  struct Buffer {
    float* ptr = nullptr;
    int64_t n = 0;
    explicit Buffer(const at::Tensor& host) : n(host.numel()) {
      const std::vector<float> padded = guarded(host);
      REQUIRE(cudaMalloc(&ptr, padded.size() * sizeof(float)) == cudaSuccess);
      REQUIRE(cudaMemcpy(ptr, padded.data(), padded.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~Buffer() { cudaFree(ptr); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    at::Tensor fetch() const {
      std::vector<float> padded(static_cast<size_t>(n + kGuard));
      REQUIRE(cudaMemcpy(padded.data(), ptr, padded.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
      return unguarded(std::move(padded), n);
    }
  };
  static void adam(Buffer& p, Buffer& g, Buffer& m, Buffer& v, int64_t n, const DstrainAdamParams& h, float scale) {
    REQUIRE(dstrain_cuda_adam_f32(p.ptr, g.ptr, m.ptr, v.ptr, static_cast<size_t>(n), &h, scale, nullptr) == 0);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  static double sum_squares(const Buffer& x, int64_t n) {
    double* out = nullptr;
    REQUIRE(cudaMalloc(&out, sizeof(double)) == cudaSuccess);
    REQUIRE(dstrain_cuda_sum_squares_f32(x.ptr, static_cast<size_t>(n), out, nullptr) == 0);
    double got = -1.0;
    REQUIRE(cudaMemcpy(&got, out, sizeof(double), cudaMemcpyDeviceToHost) == cudaSuccess);
    cudaFree(out);
    return got;
  }
};

}  // namespace dstrain::test
