#pragma once
// The routed experts with one kernel choice against another, outputs and every gradient: what
// gpu.kernels checks on a GPU (the grouped GEMMs against the expert loop, bf16 and fp32), and what
// the CPU suite runs on the same code path (fp32), so that the test's plumbing (shapes, the
// gradients' concatenation, the comparison) cannot reach the GPU broken.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/model/moe_experts.h"
#include "relative_error.h"

namespace dstrain::test {

struct ExpertCase {
  int64_t experts = 16;
  at::Tensor x, grad_out, idx, weights;
  std::vector<at::Tensor> gate, up, down;  // per expert: [I, H], [I, H], [H, I]
  // lora.experts: per expert and projection A [r, in] and B [out, r] (B non-zero), scale 2; none when empty.
  std::vector<at::Tensor> lora_a, lora_b;  // expert-major: gate, up, down of expert 0, then expert 1, ...
};

struct ExpertResults {
  at::Tensor y, grad_x, grad_w;
  at::Tensor grad_experts;  // every expert's gate, up and down gradients, then the adapters', flattened and joined
};

// 300 rows of width 256 routed top-4 over 16 experts of width 128; expert 5 gets no rows.
// lora_rank > 0: with adapters of that rank on every expert's three projections.
inline ExpertCase expert_case(at::Device device, at::ScalarType dtype, int64_t lora_rank = 0) {
  const int64_t N = 300, H = 256, I = 128, K = 4;
  ExpertCase c;
  at::manual_seed(3);
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  c.x = at::randn({N, H}, on), c.grad_out = at::randn({N, H}, on);
  at::Tensor scores = at::randn({N, c.experts}, at::TensorOptions().device(device));
  scores.select(1, 5).sub_(100);
  c.idx = std::get<1>(scores.topk(K, -1)), c.weights = at::softmax(at::randn({N, K}, on), -1);
  for (int64_t e = 0; e < c.experts; ++e) {
    c.gate.push_back(at::randn({I, H}, on) * 0.1), c.up.push_back(at::randn({I, H}, on) * 0.1);
    c.down.push_back(at::randn({H, I}, on) * 0.1);
    if (lora_rank == 0) continue;
    for (const auto& [in, out] : {std::pair{H, I}, std::pair{H, I}, std::pair{I, H}})
      c.lora_a.push_back(at::randn({lora_rank, in}, on) * 0.1), c.lora_b.push_back(at::randn({out, lora_rank}, on) * 0.1);
  }
  return c;
}

// The experts' forward and backward with `kernels`. nullopt, with the reason in *unavailable,
// when that forward itself refuses (a LibTorch without the kernel for this dtype): only that call
// is guarded, so that a mistake anywhere else fails the test.
inline std::optional<ExpertResults> run_experts(const ExpertCase& c, model::ExpertKernels kernels, std::string* unavailable) {
  model::LocalExperts x;
  std::vector<at::Tensor> adapters;  // in lora_a, lora_b order: A then B of each projection
  for (int64_t e = 0; e < c.experts; ++e) {
    x.gate.push_back(c.gate[e].clone().set_requires_grad(true));
    x.up.push_back(c.up[e].clone().set_requires_grad(true));
    x.down.push_back(c.down[e].clone().set_requires_grad(true));
    if (c.lora_a.empty()) continue;
    model::ExpertLora* loras[] = {&x.gate_lora, &x.up_lora, &x.down_lora};
    for (size_t p = 0; p < 3; ++p) {
      const size_t k = static_cast<size_t>(e) * 3 + p;
      loras[p]->a.push_back(c.lora_a[k].clone().set_requires_grad(true)),
          loras[p]->b.push_back(c.lora_b[k].clone().set_requires_grad(true));
      loras[p]->scale = 2.0;
      adapters.push_back(loras[p]->a.back()), adapters.push_back(loras[p]->b.back());
    }
  }
  const at::Tensor flat = c.x.clone().set_requires_grad(true), w = c.weights.clone().set_requires_grad(true);
  at::Tensor y;
  try {
    y = model::routed_experts(flat, c.idx, w, c.experts, x, nullptr, false, kernels).out;
  } catch (const c10::Error& e) {
    if (unavailable) *unavailable = e.what_without_backtrace();
    return std::nullopt;
  }
  y.backward(c.grad_out);
  std::vector<at::Tensor> grads;  // [I, H] and [H, I] alike: flattened before they are joined
  for (int64_t e = 0; e < c.experts; ++e)
    for (const at::Tensor& p : {x.gate[e], x.up[e], x.down[e]})
      grads.push_back((p.grad().defined() ? p.grad() : at::zeros_like(p)).reshape({-1}));
  for (const at::Tensor& p : adapters) grads.push_back((p.grad().defined() ? p.grad() : at::zeros_like(p)).reshape({-1}));
  return ExpertResults{y.detach(), flat.grad(), w.grad(), at::cat(grads)};
}

// The largest relative difference of each result (y, grad x, grad w, grad experts).
inline std::vector<double> expert_differences(const ExpertResults& a, const ExpertResults& b) {
  return {rel(a.y, b.y), rel(a.grad_x, b.grad_x), rel(a.grad_w, b.grad_w), rel(a.grad_experts, b.grad_experts)};
}

}  // namespace dstrain::test
