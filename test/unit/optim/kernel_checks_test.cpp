// gpu.kernels' optimizer checks run on the CPU: the same code (test/gpu/*_check.h) with the CPU
// kernels, or the CPU as the device, so that a check that cannot pass is caught without a GPU.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include "gpu/fused_step_check.h"
#include "gpu/optimizer_kernels_check.h"

using dstrain::test::CpuKernels;

TEST_CASE("gpu.kernels' Adam checks on the CPU kernels: AdamW and Adam against LibTorch in double, guards untouched", "[optim]") {
  dstrain::test::check_adam_against_reference<CpuKernels>();
}

TEST_CASE("gpu.kernels' Adam checks on the CPU kernels: inf and nan gradients carried where the reference has them", "[optim]") {
  dstrain::test::check_adam_nonfinite<CpuKernels>();
}

TEST_CASE("gpu.kernels' sum of squares check on the CPU kernel: a double-precision sum, the input untouched", "[optim]") {
  dstrain::test::check_sum_squares<CpuKernels>();
}

TEST_CASE("gpu.kernels' fused step checks with the CPU as the device: the twin's plumbing in fp32, bf16 and fp16", "[optim]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) dstrain::test::check_fused_step_against_cpu(at::kCPU, dtype);
  dstrain::test::check_fused_step_overflow(at::kCPU);
}
