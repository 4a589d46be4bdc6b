// gpu.kernels' layer checks run on the CPU (test/gpu/layers_check.h): the fused entry points take
// the composite path here, so what is tested is the checks' plumbing, which then reaches the GPU whole.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include "gpu/layers_check.h"

TEST_CASE("gpu.kernels' RMSNorm, SwiGLU and RoPE checks run on the CPU, fp32 and bf16", "[model]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    dstrain::test::check_rms_norm(at::kCPU, dtype);
    dstrain::test::check_silu_mul(at::kCPU, dtype);
    dstrain::test::check_rope(at::kCPU, dtype);
  }
}
