#pragma once
// The fused layers against their composite ATen forms on one device, outputs and gradients: what
// gpu.kernels checks on a GPU (the CUDA kernels, issue 21) and what the CPU suite runs on the CPU
// (where the fused entry points take the composite path), so that the checks' plumbing (shapes,
// layouts, the backward, the comparison) cannot reach the GPU broken.
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "catch_torch.h"
#include "dstrain/model/fused_layers.h"
#include "dstrain/model/layers.h"
#include "relative_error.h"

namespace dstrain::test {

inline double layer_tolerance(at::ScalarType dtype, double fp32) { return dtype == at::kFloat ? fp32 : 2e-2; }

// One layer's fused and composite forms on the same inputs, backpropagating `grad_out`: the
// relative differences of the outputs, then of each input's gradient. `forward(fused, inputs)`.
inline std::vector<double> form_differences(const std::vector<at::Tensor>& inputs, const at::Tensor& grad_out,
                                            const std::function<at::Tensor(bool, const std::vector<at::Tensor>&)>& forward) {
  std::vector<at::Tensor> results[2];  // [composite, fused]: the output, then the gradients
  for (const bool fused : {true, false}) {
    std::vector<at::Tensor> xs;
    for (const at::Tensor& t : inputs) xs.push_back(t.clone().set_requires_grad(true));
    const at::Tensor y = forward(fused, xs);
    CHECK(y.sizes() == grad_out.sizes());
    CHECK(y.scalar_type() == inputs.front().scalar_type());
    y.backward(grad_out);
    results[fused].push_back(y.detach());
    for (const at::Tensor& x : xs) results[fused].push_back(x.grad());
  }
  std::vector<double> out;
  for (size_t i = 0; i < results[0].size(); ++i) out.push_back(rel(results[1][i], results[0][i]));
  return out;
}

inline void check_rms_norm(at::Device device, at::ScalarType dtype) {
  INFO("RMSNorm, dtype " << c10::toString(dtype) << " on " << device);
  at::manual_seed(9);
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x = at::randn({4, 33, 256}, on) * 3, w = at::rand({256}, on) + 0.5, go = at::randn({4, 33, 256}, on);
  for (const double d : form_differences({x, w}, go, [](bool fused, const std::vector<at::Tensor>&in) {
         return fused ? model::rms_norm(in[0], in[1], 1e-6) : model::rms_norm_composite(in[0], in[1], 1e-6);
       }))
    CHECK(d < layer_tolerance(dtype, 1e-5));
}

inline void check_silu_mul(at::Device device, at::ScalarType dtype) {
  INFO("SwiGLU's activation, dtype " << c10::toString(dtype) << " on " << device);
  at::manual_seed(4);
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor g = at::randn({3, 77, 129}, on) * 4, u = at::randn({3, 77, 129}, on), go = at::randn({3, 77, 129}, on);
  for (const double d : form_differences({g, u}, go, [](bool fused, const std::vector<at::Tensor>&in) {
         return fused ? model::silu_mul(in[0], in[1]) : model::silu_mul_composite(in[0], in[1]);
       }))
    CHECK(d < layer_tolerance(dtype, 1e-5));
}

// On [B, T, heads, dim] storage read as [B, heads, T, dim], as the model calls it (the layout the
// CUDA kernel takes).
inline void check_rope(at::Device device, at::ScalarType dtype) {
  INFO("RoPE, dtype " << c10::toString(dtype) << " on " << device);
  at::manual_seed(6);
  const model::Rope tables(64, 512, 10000.0, dtype);
  const at::Tensor cos = tables.cos.to(device), sin = tables.sin.to(device);
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x = at::randn({2, 300, 6, 64}, on), go = at::randn({2, 6, 300, 64}, on);
  for (const double d : form_differences({x}, go, [&](bool fused, const std::vector<at::Tensor>&in) {
         const at::Tensor heads = in[0].transpose(1, 2);
         return fused ? model::rope(heads, cos, sin) : model::rope_composite(heads, cos, sin);
       }))
    CHECK(d < layer_tolerance(dtype, 1e-6));
}

}  // namespace dstrain::test
