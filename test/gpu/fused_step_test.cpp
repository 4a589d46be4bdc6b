// The fused optimizer step's CUDA kernels (cuda/fused_step.cu through optim::FusedStep) against
// its CPU twin on the same runs: fp32, bf16 and fp16 gradients, awkward run sizes, gaps that
// must stay untouched, a deterministic norm, and the model-dtype copy rounded as ATen rounds. The
// same checks run on the CPU in the unit suite (fused_step_check.h).
#include "catch_torch.h"

#include <ATen/ATen.h>

#include "fused_step_check.h"

TEST_CASE("fused step on the GPU matches its CPU twin in fp32, bf16 and fp16", "[gpu]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf})
    dstrain::test::check_fused_step_against_cpu(c10::Device(c10::kCUDA, 0), dtype);
}

TEST_CASE("fused step on the GPU: overflow shows in the norm; no runs is no work", "[gpu]") {
  dstrain::test::check_fused_step_overflow(c10::Device(c10::kCUDA, 0));
}
