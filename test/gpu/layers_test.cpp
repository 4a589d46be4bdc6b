// The model's fused GPU layers against their composite ATen forms on the same GPU: outputs and
// gradients (issue 21: each fused kernel has a gradient test against ATen on the GPU). The same
// checks run on the CPU in the unit suite (layers_check.h).
#include "catch_torch.h"

#include <ATen/ATen.h>

#include "layers_check.h"

TEST_CASE("RMSNorm on the GPU (ATen's fused kernel) matches the composite, forward and backward", "[gpu]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) dstrain::test::check_rms_norm(at::kCUDA, dtype);
}

TEST_CASE("SwiGLU's activation: the fused CUDA kernel matches silu(gate) * up, forward and backward", "[gpu]") {
  REQUIRE(dstrain::model::fused_layers_enabled());
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) dstrain::test::check_silu_mul(at::kCUDA, dtype);
}

TEST_CASE("RoPE: the fused CUDA kernel on [B, T, heads, dim] storage matches the composite, forward and backward", "[gpu]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) dstrain::test::check_rope(at::kCUDA, dtype);
}
