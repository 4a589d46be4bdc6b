// The routed experts on the GPU: the grouped GEMMs (at::_grouped_mm, Hopper's grouped kernels in
// bf16) against the expert loop, outputs and every gradient (issue 22, deliverable 1). The same
// check runs on the CPU in the unit suite (moe_experts_check.h).
#include "catch_torch.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "dstrain/model/moe_experts.h"
#include "moe_experts_check.h"

TEST_CASE("MoE experts: grouped GEMMs on the GPU match the expert loop, forward and backward", "[gpu]") {
  using dstrain::model::ExpertKernels;
  for (const int64_t lora_rank : {0, 16})  // 16: lora.experts' adapters, two more grouped GEMMs per projection
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      INFO("dtype " << c10::toString(dtype) << ", adapters of rank " << lora_rank);
      const auto c = dstrain::test::expert_case(at::kCUDA, dtype, lora_rank);
      std::string unavailable;
      const auto grouped = dstrain::test::run_experts(c, ExpertKernels::kGroupedMm, &unavailable);
      if (!grouped) {
        // Only bf16 is what kAuto uses on a GPU; a LibTorch without an fp32 grouped GEMM is noted.
        if (dtype == at::kBFloat16) FAIL("no bf16 at::_grouped_mm on this GPU: " << unavailable);
        WARN("no fp32 at::_grouped_mm on this GPU: " << unavailable);
        continue;
      }
      const auto loop = dstrain::test::run_experts(c, ExpertKernels::kLoop, nullptr);
      REQUIRE(loop);
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      for (const double d : dstrain::test::expert_differences(*grouped, *loop)) CHECK(d < tol);
    }
  // What kAuto picks: the grouped kernels for bf16 rows of 16-byte multiples.
  dstrain::model::LocalExperts x;
  x.gate.push_back(at::zeros({128, 256}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16)));
  CHECK(dstrain::model::grouped_mm_fits(at::zeros({4, 256}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16)), x));
  CHECK_FALSE(dstrain::model::grouped_mm_fits(at::zeros({4, 256}, at::TensorOptions().dtype(at::kBFloat16)), x));
  // Adapters: their rank is the inner size of two GEMMs, so 16-byte multiples too.
  for (const auto& [rank, fits] : {std::pair{int64_t{16}, true}, std::pair{int64_t{4}, false}}) {
    x.gate_lora.a = {at::zeros({rank, 256}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16))};
    CHECK(dstrain::model::grouped_mm_fits(at::zeros({4, 256}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16)), x) == fits);
  }
}
