// The routed experts on the GPU: the grouped GEMMs (at::_grouped_mm, Hopper's grouped kernels in
// bf16) against the expert loop, outputs and every gradient (issue 22, deliverable 1).
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <tuple>
#include <vector>

#include "dstrain/model/moe_experts.h"
#include "relative_error.h"

using dstrain::test::rel;

TEST_CASE("MoE experts: grouped GEMMs on the GPU match the expert loop, forward and backward", "[gpu]") {
  using dstrain::model::ExpertKernels;
  const int64_t N = 300, H = 256, I = 128, E = 16, K = 4;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    INFO("dtype " << c10::toString(dtype));
    at::manual_seed(3);
    const auto on = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor x0 = at::randn({N, H}, on), go = at::randn({N, H}, on);
    at::Tensor scores = at::randn({N, E}, at::TensorOptions().device(at::kCUDA));
    scores.select(1, 5).sub_(100);  // expert 5 gets no rows
    const at::Tensor idx = std::get<1>(scores.topk(K, -1)), w0 = at::softmax(at::randn({N, K}, on), -1);
    std::vector<at::Tensor> g0, u0, d0;
    for (int64_t e = 0; e < E; ++e) {
      g0.push_back(at::randn({I, H}, on) * 0.1), u0.push_back(at::randn({I, H}, on) * 0.1), d0.push_back(at::randn({H, I}, on) * 0.1);
    }
    auto run = [&](ExpertKernels kernels) {
      dstrain::model::LocalExperts x;
      for (int64_t e = 0; e < E; ++e) {
        x.gate.push_back(g0[e].clone().set_requires_grad(true));
        x.up.push_back(u0[e].clone().set_requires_grad(true));
        x.down.push_back(d0[e].clone().set_requires_grad(true));
      }
      const at::Tensor flat = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
      const at::Tensor y = dstrain::model::routed_experts(flat, idx, w, E, x, nullptr, false, kernels).out;
      y.backward(go);
      std::vector<at::Tensor> expert_grads;
      for (int64_t e = 0; e < E; ++e)
        for (const at::Tensor& p : {x.gate[e], x.up[e], x.down[e]})
          expert_grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
      return std::make_tuple(y.detach(), flat.grad(), w.grad(), at::cat(expert_grads, 1));
    };
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> grouped;
    try {
      grouped = run(ExpertKernels::kGroupedMm);
    } catch (const c10::Error& e) {
      // Only bf16 is what kAuto uses on a GPU; a LibTorch without an fp32 grouped GEMM is noted.
      if (dtype == at::kBFloat16) throw;
      WARN("no fp32 at::_grouped_mm on this GPU: " << e.what_without_backtrace());
      continue;
    }
    const auto [y1, gx1, gw1, ge1] = grouped;
    const auto [y2, gx2, gw2, ge2] = run(ExpertKernels::kLoop);
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    CHECK(rel(y1, y2) < tol);
    CHECK(rel(gx1, gx2) < tol);
    CHECK(rel(gw1, gw2) < tol);
    CHECK(rel(ge1, ge2) < tol);
  }
  // What kAuto picks: the grouped kernels for bf16 rows of 16-byte multiples.
  dstrain::model::LocalExperts x;
  x.gate.push_back(at::zeros({I, H}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16)));
  CHECK(dstrain::model::grouped_mm_fits(at::zeros({4, H}, at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16)), x));
  CHECK_FALSE(dstrain::model::grouped_mm_fits(at::zeros({4, H}, at::TensorOptions().dtype(at::kBFloat16)), x));
}
