#include "dstrain/bench/moe_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "dstrain/core/error.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/moe_experts.h"

namespace dstrain::tasks {
namespace {

// dstrain's MoE layer before the experts were grouped: per expert, find its token copies,
// gather them, run its SwiGLU and scatter the weighted rows back.
at::Tensor per_expert_layer(const at::Tensor& flat, const at::Tensor& idx, const at::Tensor& weights, const model::LocalExperts& x) {
  const int64_t K = idx.size(1);
  const at::Tensor flat_idx = idx.reshape({-1}), flat_w = weights.reshape({-1}).to(flat.scalar_type());
  at::Tensor out = at::zeros_like(flat);
  for (size_t e = 0; e < x.gate.size(); ++e) {
    const at::Tensor copies = flat_idx.eq(static_cast<int64_t>(e)).nonzero().squeeze(1);
    if (copies.numel() == 0) continue;
    const at::Tensor token = copies.div(K, "floor");
    const at::Tensor y = model::swiglu(flat.index_select(0, token), x.gate[e], x.up[e], x.down[e]);
    out = out.index_add(0, token, y * flat_w.index_select(0, copies).unsqueeze(1));
  }
  return out;
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

}  // namespace

std::vector<MoeBenchRow> bench_moe(const MoeBenchOptions& o) {
  if (o.experts < 1 || o.top_k < 1 || o.top_k > o.experts)
    throw Error(ErrorCode::kUsage, "bench moe: --top-k must be between 1 and --experts", "for example --experts 64 --top-k 6");
  if (o.threads > 0) at::set_num_threads(o.threads);
  const at::Device device = o.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const at::ScalarType dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  at::manual_seed(17);
  const at::Tensor x0 = at::randn({o.tokens, o.hidden}, on), go = at::randn({o.tokens, o.hidden}, on);
  const at::Tensor scores = at::softmax(at::randn({o.tokens, o.experts}, at::TensorOptions().device(device)), -1);
  const auto [top, idx] = scores.topk(o.top_k, -1);
  const at::Tensor w0 = (top / top.sum(-1, true)).to(dtype);
  model::LocalExperts experts;
  for (int64_t e = 0; e < o.experts; ++e) {
    experts.gate.push_back((at::randn({o.inner, o.hidden}, on) * 0.02).set_requires_grad(true));
    experts.up.push_back((at::randn({o.inner, o.hidden}, on) * 0.02).set_requires_grad(true));
    experts.down.push_back((at::randn({o.hidden, o.inner}, on) * 0.02).set_requires_grad(true));
  }
  using Layer = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
  const std::vector<std::pair<std::string, Layer>> ways = {
      {"per expert (previous)", [&](const at::Tensor& x, const at::Tensor& w) { return per_expert_layer(x, idx, w, experts); }},
      {"grouped, expert loop",
       [&](const at::Tensor& x, const at::Tensor& w) {
         return model::routed_experts(x, idx, w, o.experts, experts, nullptr, false, model::ExpertKernels::kLoop).out;
       }},
      {"grouped GEMMs",
       [&](const at::Tensor& x, const at::Tensor& w) {
         return model::routed_experts(x, idx, w, o.experts, experts, nullptr, false, model::ExpertKernels::kGroupedMm).out;
       }},
  };
  std::vector<MoeBenchRow> rows;
  at::Tensor reference;
  const double flops = 18.0 * static_cast<double>(o.tokens * o.top_k) * static_cast<double>(o.hidden * o.inner);
  for (const auto& [name, layer] : ways) {
    std::vector<double> times;
    at::Tensor out;
    for (int i = 0; i <= o.iters; ++i) {  // the first is a warm-up
      for (auto* list : {&experts.gate, &experts.up, &experts.down})
        for (at::Tensor& p : *list) p.mutable_grad() = at::Tensor();
      const at::Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
      synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      out = layer(x, w);
      out.backward(go);
      synchronize(device);
      if (i > 0) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    MoeBenchRow row{name, times[times.size() / 2], 0, 0};
    row.tflops = flops / (row.ms / 1e3) / 1e12;
    const at::Tensor got = out.detach().to(at::kFloat);
    if (!reference.defined()) reference = got;
    row.max_abs_err = (got - reference).abs().max().item<double>();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace dstrain::tasks
