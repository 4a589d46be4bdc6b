// The model's fused GPU layers against their composite ATen forms on the same GPU: outputs and
// gradients (issue 21: each fused kernel has a gradient test against ATen on the GPU).
#include "catch_torch.h"

#include <ATen/ATen.h>

#include "dstrain/model/fused_layers.h"
#include "dstrain/model/layers.h"
#include "relative_error.h"

using dstrain::test::rel;

TEST_CASE("RMSNorm on the GPU (ATen's fused kernel) matches the composite, forward and backward", "[gpu]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    at::manual_seed(9);
    const auto on = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor x0 = at::randn({4, 33, 256}, on) * 3, w0 = at::rand({256}, on) + 0.5, go = at::randn({4, 33, 256}, on);
    auto run = [&](bool fused) {
      const at::Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
      const at::Tensor y = fused ? dstrain::model::rms_norm(x, w, 1e-6) : dstrain::model::rms_norm_composite(x, w, 1e-6);
      y.backward(go);
      return std::make_tuple(y.detach(), x.grad(), w.grad());
    };
    const auto [y1, gx1, gw1] = run(true);
    const auto [y2, gx2, gw2] = run(false);
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    CHECK(y1.scalar_type() == dtype);
    CHECK(rel(y1, y2) < tol);
    CHECK(rel(gx1, gx2) < tol);
    CHECK(rel(gw1, gw2) < tol);
  }
}

TEST_CASE("SwiGLU's activation: the fused CUDA kernel matches silu(gate) * up, forward and backward", "[gpu]") {
  REQUIRE(dstrain::model::fused_layers_enabled());
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    INFO("dtype " << c10::toString(dtype));
    at::manual_seed(4);
    const auto on = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor g0 = at::randn({3, 77, 129}, on) * 4, u0 = at::randn({3, 77, 129}, on), go = at::randn({3, 77, 129}, on);
    auto run = [&](bool fused) {
      const at::Tensor g = g0.clone().set_requires_grad(true), u = u0.clone().set_requires_grad(true);
      const at::Tensor y = fused ? dstrain::model::silu_mul(g, u) : dstrain::model::silu_mul_composite(g, u);
      y.backward(go);
      return std::make_tuple(y.detach(), g.grad(), u.grad());
    };
    const auto [y1, gg1, gu1] = run(true);
    const auto [y2, gg2, gu2] = run(false);
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    CHECK(rel(y1, y2) < tol);
    CHECK(rel(gg1, gg2) < tol);
    CHECK(rel(gu1, gu2) < tol);
  }
}

TEST_CASE("RoPE: the fused CUDA kernel on [B, T, heads, dim] storage matches the composite, forward and backward", "[gpu]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    at::manual_seed(6);
    const dstrain::model::Rope tables(64, 512, 10000.0, dtype);
    const at::Tensor cos = tables.cos.to(at::kCUDA), sin = tables.sin.to(at::kCUDA);
    const auto on = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor x0 = at::randn({2, 300, 6, 64}, on), go = at::randn({2, 6, 300, 64}, on);
    auto run = [&](bool fused) {
      const at::Tensor x = x0.clone().set_requires_grad(true);
      const at::Tensor heads = x.transpose(1, 2);  // [B, heads, T, dim], as the model calls it
      const at::Tensor y = fused ? dstrain::model::rope(heads, cos, sin) : dstrain::model::rope_composite(heads, cos, sin);
      y.backward(go);
      return std::make_pair(y.detach(), x.grad());
    };
    const auto [y1, gx1] = run(true);
    const auto [y2, gx2] = run(false);
    const double tol = dtype == at::kFloat ? 1e-6 : 2e-2;
    CHECK(rel(y1, y2) < tol);
    CHECK(rel(gx1, gx2) < tol);
  }
}
