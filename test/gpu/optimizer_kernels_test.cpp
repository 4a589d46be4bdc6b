// The fused CUDA optimizer kernels against a LibTorch reference computed in double on the CPU:
// odd sizes, guard elements after the buffers (poisoned with NaN: the kernels must not touch
// them), inf/nan gradients, and the overflow flag. The Adam checks run on the CPU kernels in the
// unit suite too (optimizer_kernels_check.h).
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuda_kernels.h"
#include "dstrain/device/pinned_memory.h"
#include "dstrain_cuda.h"

using dstrain::test::CudaKernels;
using DeviceBuffer = CudaKernels::Buffer;

TEST_CASE("fused CUDA Adam and AdamW match LibTorch in double", "[gpu]") { dstrain::test::check_adam_against_reference<CudaKernels>(); }

TEST_CASE("fused CUDA Adam carries inf and nan gradients where the reference does", "[gpu]") {
  dstrain::test::check_adam_nonfinite<CudaKernels>();
}

TEST_CASE("unscale multiplies in place and raises the overflow flag for any inf or nan", "[gpu]") {
  int* flag = nullptr;
  REQUIRE(cudaMalloc(&flag, sizeof(int)) == cudaSuccess);
  for (const int64_t n : {int64_t{1}, int64_t{257}, (int64_t{1} << 20) + 3}) {
    for (const int64_t bad_at : {int64_t{-1}, int64_t{0}, n / 2, n - 1}) {
      for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        at::manual_seed(static_cast<uint64_t>(n + bad_at));
        at::Tensor g = at::randn({n}) * 65536.0;
        if (bad_at >= 0) g[bad_at] = bad;
        DeviceBuffer dg(g);
        REQUIRE(cudaMemset(flag, 0, sizeof(int)) == cudaSuccess);
        REQUIRE(dstrain_cuda_unscale_found_inf_f32(dg.ptr, static_cast<size_t>(n), 1.0f / 65536.0f, flag, nullptr) == 0);
        int found = -1;
        REQUIRE(cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
        INFO("n = " << n << ", bad at " << bad_at);
        CHECK(found == (bad_at >= 0 ? 1 : 0));
        const at::Tensor want = g * (1.0f / 65536.0f);  // a power of two: exact
        const at::Tensor got = dg.fetch();
        CHECK(at::equal(got.isfinite(), want.isfinite()));
        CHECK(at::equal(got.masked_select(want.isfinite()), want.masked_select(want.isfinite())));
      }
    }
  }
  // The flag is only ever set: a second, clean buffer leaves a raised flag raised.
  at::Tensor clean = at::ones({10});
  DeviceBuffer dc(clean);
  REQUIRE(cudaMemset(flag, 0, sizeof(int)) == cudaSuccess);
  int one = 1;
  REQUIRE(cudaMemcpy(flag, &one, sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(dstrain_cuda_unscale_found_inf_f32(dc.ptr, 10, 0.5f, flag, nullptr) == 0);
  int found = -1;
  REQUIRE(cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(found == 1);
  cudaFree(flag);
}

TEST_CASE("pinned host memory (cudaHostRegister): exactly the size asked for, and asynchronous copies through it are exact", "[gpu]") {
  const int64_t n = (int64_t{1} << 24) + 3;  // the caching host allocator would pin 2x this
  at::Tensor host = dstrain::device::pinned_empty(n, at::kBFloat16, "a test buffer");
  CHECK(host.is_pinned());
  // Exact where this machine lets CUDA register memory (a sandbox may not: ATen's allocator then).
  std::vector<char> probe(1 << 16);
  if (dstrain_cuda_host_register(probe.data(), probe.size()) == 0) {
    dstrain_cuda_host_unregister(probe.data());
    CHECK(host.storage().nbytes() == static_cast<size_t>(2 * n));
  } else {
    WARN("cudaHostRegister is refused here: pinned buffers come from ATen's allocator");
  }
  const at::Tensor source = at::randn({n}, at::TensorOptions().device(at::kCUDA)).to(at::kBFloat16);
  host.copy_(source, /*non_blocking=*/true);
  at::Tensor back = at::empty({n}, source.options());
  back.copy_(host, /*non_blocking=*/true);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(at::equal(back, source));
}
