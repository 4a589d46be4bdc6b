#include "dstrain/model/moe_experts.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/model/fused_layers.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rows of `input` exchanged over `group`; `meanwhile` runs while the exchange is in flight.
// The time blocked on it is added to *wait_ns.
at::Tensor exchange_rows(comm::Communicator& group, const at::Tensor& input, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows, std::atomic<int64_t>* wait_ns,
                         const std::function<void()>& meanwhile = {}) {
  const at::Tensor in = input.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  at::Tensor out = at::empty(shape, in.options());
  const comm::WorkHandle work = group.all_to_all(in, out, send_rows, recv_rows);
  if (meanwhile) meanwhile();
  const auto t0 = std::chrono::steady_clock::now();
  work->wait();
  if (wait_ns) *wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// The rows of `input` as exchanged (`received`, already there), differentiably: the gradient
// goes back through the reverse exchange.
struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& received, comm::Communicator* group,
                            std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows, std::atomic<int64_t>* wait_ns) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["wait_ns"] = reinterpret_cast<int64_t>(wait_ns);
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return received;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<comm::Communicator*>(ctx->saved_data["group"].toInt());
    auto* wait_ns = reinterpret_cast<std::atomic<int64_t>*>(ctx->saved_data["wait_ns"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {exchange_rows(*group, grads[0], recv, send, wait_ns), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// exchange_rows, differentiable.
at::Tensor exchange_differentiable(comm::Communicator& group, const at::Tensor& input, const std::vector<int64_t>& send_rows,
                                   const std::vector<int64_t>& recv_rows, const ExchangeHooks& hooks,
                                   const std::function<void()>& meanwhile = {}) {
  // The payload only (detached; `meanwhile` records its own graph): AllToAllRows puts it in the graph.
  const at::Tensor received = exchange_rows(group, input.detach(), send_rows, recv_rows, hooks.wait_ns, meanwhile);
  return AllToAllRows::apply(input, received, &group, send_rows, recv_rows, hooks.wait_ns);
}

// One expert's projection of x with its adapter: x Wᵀ + (x Aᵀ) Bᵀ · scale (PEFT's order); x Wᵀ
// when a is undefined. By value: a recomputed activation runs it in backward.
Projection expert_projection(size_t e, const std::vector<at::Tensor>& weights, const ExpertLora& lora,
                             const std::vector<std::shared_ptr<const LinearBase>>& bases) {
  const bool on = !lora.empty() && adapters_on();
  const at::Tensor a = on ? lora.a[e] : at::Tensor(), b = on ? lora.b[e] : at::Tensor();
  std::shared_ptr<const LinearBase> base = bases.empty() ? nullptr : bases[e];
  return [w = weights[e], a, b, scale = lora.scale, base](const at::Tensor& x) {
    const at::Tensor y = base ? base->product(x, w) : at::linear(x, w);
    return a.defined() ? y + at::linear(at::linear(x.to(a.scalar_type()), a), b) * scale : y;
  };
}

// The same for all local experts at once, as grouped GEMMs over rows sorted by expert.
at::Tensor grouped_projection(const at::Tensor& rows, const std::vector<at::Tensor>& weights, const ExpertLora& lora,
                              const at::Tensor& offsets) {
  const at::Tensor y = at::_grouped_mm(rows, at::stack(weights).transpose(1, 2), offsets);
  if (lora.empty() || !adapters_on()) return y;
  const at::Tensor xa = at::_grouped_mm(rows.to(lora.a.front().scalar_type()), at::stack(lora.a).transpose(1, 2), offsets);
  return y + at::_grouped_mm(xa, at::stack(lora.b).transpose(1, 2), offsets) * lora.scale;
}

// Experts [0, counts.size()) of `experts` on rows sorted by expert (counts[e] rows each).
// Always a function of `rows` (even when no expert has a row): autograd must reach every
// all-to-all behind it on every rank, or the ranks' exchanges would not pair up.
// One split, not a narrow per expert: a narrow's backward writes a zero tensor of all the rows
// (E of them per layer), the split's backward one concatenation.
at::Tensor run_local_experts(const at::Tensor& rows, const std::vector<int64_t>& counts, const LocalExperts& experts, bool selective) {
  const std::vector<at::Tensor> parts = rows.split_with_sizes(counts);
  // Adapters or a quantized base: each projection through expert_projection; else the plain weights.
  const bool per_projection = !experts.gate_lora.empty() || !experts.up_lora.empty() || !experts.down_lora.empty() || experts.quantized();
  std::vector<at::Tensor> outs;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    if (!per_projection) {
      outs.push_back(swiglu(parts[e], experts.gate[e], experts.up[e], experts.down[e], selective));
      continue;
    }
    outs.push_back(swiglu(parts[e], expert_projection(e, experts.gate, experts.gate_lora, experts.gate_base),
                          expert_projection(e, experts.up, experts.up_lora, experts.up_base),
                          expert_projection(e, experts.down, experts.down_lora, experts.down_base), selective));
  }
  return outs.empty() ? rows : at::cat(outs);
}

// All local experts at once: rows sorted by expert, `counts` [local] int64 on the rows' device.
// Each projection is one grouped GEMM over the experts' stacked weights ([E, out, in], read
// transposed: the column-major operand the grouped kernels take).
at::Tensor run_grouped_experts(const at::Tensor& rows, const at::Tensor& counts, const LocalExperts& experts, bool selective) {
  const at::Tensor offsets = counts.cumsum(0).to(at::kInt);
  const at::Tensor g = grouped_projection(rows, experts.gate, experts.gate_lora, offsets),
                   u = grouped_projection(rows, experts.up, experts.up_lora, offsets);
  at::Tensor act;
  if (selective) {
    const Region activation = [](const std::vector<at::Tensor>& in, bool) { return std::vector<at::Tensor>{silu_mul(in[0], in[1])}; };
    act = recompute(activation, {g, u}).at(0);
  } else {
    act = silu_mul(g, u);
  }
  return grouped_projection(act, experts.down, experts.down_lora, offsets);
}

at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& counts, const LocalExperts& experts, bool selective,
                       bool grouped) {
  if (!grouped || rows.size(0) == 0) return run_local_experts(rows, counts, experts, selective);  // (no rows: kept connected)
  return run_grouped_experts(rows, at::tensor(counts, at::kLong).to(rows.device()), experts, selective);
}

// Sorted rows -> their experts' ranks -> the local experts -> back, in the same order.
// The dispatch is issued before hooks.while_dispatching runs and waited for after it.
at::Tensor run_parallel_experts(comm::Communicator& group, const at::Tensor& sorted, const std::vector<int64_t>& counts,
                                const at::Tensor& device_counts, const LocalExperts& experts, bool selective, bool grouped,
                                const ExchangeHooks& hooks) {
  const int E = group.world_size();
  const int64_t local = static_cast<int64_t>(experts.gate.size());
  // Counts first: rank r receives, from every rank, how many rows it routes to each of r's experts.
  const std::vector<int64_t> block(static_cast<size_t>(E), local);
  const at::Tensor arrived_counts = exchange_rows(group, device_counts, block, block, hooks.wait_ns).cpu();  // [E * local]: (src, expert)
  const int64_t* from = arrived_counts.data_ptr<int64_t>();
  std::vector<int64_t> send_rows(static_cast<size_t>(E), 0), recv_rows(static_cast<size_t>(E), 0);
  for (int r = 0; r < E; ++r)
    for (int64_t e = 0; e < local; ++e) {
      send_rows[static_cast<size_t>(r)] += counts[static_cast<size_t>(r * local + e)];
      recv_rows[static_cast<size_t>(r)] += from[r * local + e];
    }
  const at::Tensor arrived = exchange_differentiable(group, sorted, send_rows, recv_rows, hooks, hooks.while_dispatching);  // (src, expert)
  // Into (expert, src) order, so that each local expert's rows are contiguous.
  std::vector<int64_t> offset(static_cast<size_t>(E * local) + 1, 0);
  for (int64_t i = 0; i < E * local; ++i) offset[static_cast<size_t>(i) + 1] = offset[static_cast<size_t>(i)] + from[i];
  std::vector<int64_t> perm, per_expert(static_cast<size_t>(local), 0);
  perm.reserve(static_cast<size_t>(offset.back()));
  for (int64_t e = 0; e < local; ++e)
    for (int r = 0; r < E; ++r) {
      const int64_t i = r * local + e;
      for (int64_t k = offset[static_cast<size_t>(i)]; k < offset[static_cast<size_t>(i) + 1]; ++k) perm.push_back(k);
      per_expert[static_cast<size_t>(e)] += from[i];
    }
  const at::Tensor order = at::tensor(perm, at::kLong).to(sorted.device());
  const at::Tensor by_expert = run_experts(arrived.index_select(0, order), per_expert, experts, selective, grouped);
  const at::Tensor back = at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));  // the inverse
  return exchange_differentiable(group, by_expert.index_select(0, back), recv_rows, send_rows, hooks);
}

}  // namespace

bool grouped_mm_fits(const at::Tensor& rows, const LocalExperts& experts) {
  static const bool enabled = [] {
    const char* v = std::getenv("DSTRAIN_GROUPED_MM");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  // A quantized base runs the loop: each expert's weight dequantized in turn, never all at once.
  if (!enabled || !rows.is_cuda() || rows.scalar_type() != at::kBFloat16 || experts.gate.empty() || experts.quantized()) return false;
  const int64_t H = rows.size(1), I = experts.gate[0].size(0);
  bool ranks_fit = true;  // an adapter's rank is the inner size of its two GEMMs
  for (const ExpertLora* lora : {&experts.gate_lora, &experts.up_lora, &experts.down_lora})
    ranks_fit = ranks_fit && (lora->empty() || lora->a.front().size(0) % 8 == 0);
  return H % 8 == 0 && I % 8 == 0 && ranks_fit;  // 16-byte rows of bf16
}

RoutedOutput routed_experts(const at::Tensor& flat, const at::Tensor& idx, const at::Tensor& weights, int64_t n_experts,
                            const LocalExperts& experts, comm::Communicator* ep_group, bool selective, ExpertKernels kernels,
                            const ExchangeHooks& hooks) {
  const int E = ep_group ? ep_group->world_size() : 1;
  const int64_t local = static_cast<int64_t>(experts.gate.size());
  if (n_experts % E != 0 || local * E != n_experts || (ep_group && experts.first != ep_group->rank() * local))
    throw Error(ErrorCode::kInternal,
                fmt::format("routed experts: rank holds experts [{}, +{}) of {} over {} ranks", experts.first, local, n_experts, E),
                "this is a dstrain bug; please report it");
  const int64_t N = flat.size(0), K = idx.size(1);
  const at::Tensor flat_idx = idx.reshape({-1});
  const at::Tensor order = flat_idx.argsort(/*stable=*/true);
  const at::Tensor token_of = at::arange(N, flat.options().dtype(at::kLong)).repeat_interleave(K).index_select(0, order);
  const at::Tensor weight_of = weights.reshape({-1}).index_select(0, order).to(flat.scalar_type());
  const at::Tensor counts = at::bincount(flat_idx, {}, n_experts);
  const at::Tensor sorted = flat.index_select(0, token_of);  // [N * K, H], expert by expert
  const bool grouped = (kernels == ExpertKernels::kGroupedMm && !experts.quantized()) ||
                       (kernels == ExpertKernels::kAuto && grouped_mm_fits(sorted, experts));
  at::Tensor expert_out;
  if (grouped && !ep_group) {
    expert_out = run_grouped_experts(sorted, counts, experts, selective);  // no host synchronisation
  } else {
    const at::Tensor host_counts = counts.cpu();  // the loop and the exchange run on the host (one sync per MoE layer on a GPU)
    const std::vector<int64_t> count(host_counts.data_ptr<int64_t>(), host_counts.data_ptr<int64_t>() + n_experts);
    expert_out = ep_group ? run_parallel_experts(*ep_group, sorted, count, counts, experts, selective, grouped, hooks)
                          : run_local_experts(sorted, count, experts, selective);
  }
  return {at::zeros_like(flat).index_add(0, token_of, expert_out * weight_of.unsqueeze(1)), counts};
}

}  // namespace dstrain::model
