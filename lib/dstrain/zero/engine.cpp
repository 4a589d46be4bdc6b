#include "dstrain/zero/engine_impl.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "dstrain/core/error.h"
#include "dstrain/device/host_read.h"
#include "dstrain/optim/device_adam.h"

namespace dstrain::zero {

Engine::Engine(model::CausalLM& model, comm::Communicator& comm, const EngineOptions& options, const ExpertGroups& experts,
               comm::Communicator* step_world)
    : impl_(std::make_unique<Impl>(model, comm, options, experts)) {
  impl_->step_world = step_world;
  if (options.step_boundary_comm && options.overlap_comm)
    throw Error(ErrorCode::kInternal, "the ZeRO engine cannot overlap per-micro-batch reductions when it communicates at step boundaries",
                "this is a dstrain bug; please report it");
  if (options.stage < 0 || options.stage > 3) throw Error(ErrorCode::kConfig, fmt::format("zero.stage {} is not 0-3", options.stage));
  if (options.offload_param && options.stage == 3 && !options.offload_optimizer)
    throw Error(ErrorCode::kConfig,
                "zero.offload_param needs zero.offload_optimizer: the parameter shard is updated where the optimizer runs",
                "set zero.offload_optimizer: cpu as well");
  if (options.delayed_update && !options.offload_optimizer)
    throw Error(ErrorCode::kConfig, "zero.delayed_update needs zero.offload_optimizer: it delays the CPU optimizer's update",
                "set zero.offload_optimizer: cpu, or zero.delayed_update: false");
  impl_->build();
  model.set_layer_gate(impl_.get());
}

Engine::~Engine() {
  if (impl_->updater.joinable()) impl_->updater.join();  // an error it had is moot now
  impl_->model.set_layer_gate(nullptr);
}

void Engine::settle() {
  c10::NoGradGuard no_grad;
  if (impl_->opt.delayed_update) impl_->apply_delayed();
}

const Layout& Engine::layout() const { return impl_->layout; }

void Engine::discard_wait_times() { impl_->waited_ms = impl_->waited_gather_ms = 0; }

double Engine::loss_scale() const { return impl_->opt.dtype == config::Dtype::kFp16 ? impl_->scaler.scale() : 1.0; }

StepResult Engine::step(double lr, int64_t applied_step, const StepScalars& scalars, double beta1, double beta2) {
  Impl& m = *impl_;
  c10::NoGradGuard no_grad;
  m.drain_all();
  StepResult result;
  result.loss_scale = loss_scale();
  if (nonfinite_marked_) {
    if (const at::Tensor first = m.first_grad(); first.defined()) first.fill_(std::numeric_limits<float>::infinity());
    nonfinite_marked_ = false;
  }
  // One small all-reduce and one read of it: the caller's sums, this rank's part of the squared
  // gradient norm (its shard's; unsharded, nothing: its own norm is the norm) and a count of the
  // ranks whose gradients are not finite, so that no rank updates while another skips (an fp16
  // overflow). With expert parallelism at stage 0 the parts count each gradient once
  // (plan_expert_norm). The squares are summed in double straight from the model-dtype gradients
  // (one pass): the norm decides clipping, and fp32 accumulation here would let ranks and the
  // single process drift apart. Everything stays on the device until the one read.
  const auto doubles = at::TensorOptions().dtype(at::kDouble).device(m.device);
  at::Tensor local_sq = m.fused->grad_sum_squares_tensor().to(doubles);
  const at::Tensor device_sums = scalars.device.defined() ? scalars.device.to(doubles).reshape({-1}) : at::empty({0}, doubles);
  if (device_sums.numel() > 0)  // a NaN loss on this rank: as non-finite gradients (the norm reads inf)
    local_sq = at::where(at::isfinite(device_sums).all(), local_sq, std::numeric_limits<double>::infinity());
  // MoE: the step's tokens per expert ride along, and every rank moves V3's selection bias by
  // the same global load (model -> engine -> model).
  const at::Tensor local_load = m.model.take_expert_load();
  const int64_t load_values = local_load.defined() ? local_load.numel() : 0;
  const at::Tensor load = load_values > 0 ? local_load.to(doubles).reshape({-1}) : at::empty({0}, doubles);
  const int64_t host_n = static_cast<int64_t>(scalars.host.size()), device_n = device_sums.numel();
  const int64_t norm_at = host_n + device_n + load_values;
  // float64 on the wire: the norm of a sharded or pipelined run then equals the single
  // process's (summed in double) but for the order of a few additions; float32 rounded it at
  // 6e-8, which clipping turned into a drift of 1e-5 in 50 steps.
  at::Tensor packed =
      at::cat({device::send_to_device(scalars.host, m.device), device_sums, load, m.counted_sum_squares(local_sq).reshape({1}),
               at::isfinite(local_sq).logical_not().to(at::kDouble).reshape({1})});
  comm::Communicator& everyone = m.step_world ? *m.step_world : m.comm;
  if (everyone.world_size() > 1) timed_wait(*everyone.all_reduce(packed), m.waited_ms);
  const std::vector<double> reduced = device::read_to_host(at::cat({packed, local_sq.reshape({1})}));  // the step's one read
  const double* values = reduced.data();
  result.sums.assign(values, values + host_n);
  result.device_sums.assign(values + host_n, values + host_n + device_n);
  if (load_values > 0) {
    const std::vector<double> global_load(values + host_n + device_n, values + norm_at);
    result.expert_load = at::tensor(global_load, at::kDouble).view(local_load.sizes()).to(at::kFloat);
    m.model.update_expert_bias(result.expert_load);
  }
  const double mine_sq = values[norm_at + 2];
  const double total_sq = !m.step_world && (m.replicated_norm() || m.world == 1) ? mine_sq : values[norm_at];
  const double divisor = (m.opt.average_over_ranks ? m.world : 1) * result.loss_scale;
  result.grad_norm = std::sqrt(total_sq) / divisor;
  result.skipped = values[norm_at + 1] > 0 || !std::isfinite(total_sq);
  if (m.opt.dtype == config::Dtype::kFp16) m.scaler.update(result.skipped);
  if (m.opt.delayed_update) m.apply_delayed();  // the previous step's update, computed while this step ran
  if (result.skipped) {
    ++skipped_;
  } else {
    double scale = 1.0 / divisor;
    if (m.opt.grad_clip > 0 && result.grad_norm > m.opt.grad_clip) scale *= m.opt.grad_clip / (result.grad_norm + 1e-6);
    optim::AdamHyper h = m.opt.adam;
    h.lr = lr;
    h.step = applied_step;
    if (beta1 >= 0) h.beta1 = beta1;
    if (beta2 >= 0) h.beta2 = beta2;
    if (m.opt.delayed_update && applied_step > m.opt.delayed_update_after) {
      m.start_delayed(m.grad_shard_contiguous(), h, static_cast<float>(scale));  // applied at the end of the next step
    } else {
      if (m.offload)
        m.offload_update(m.grad_shard_contiguous(), h, static_cast<float>(scale));
      else
        m.fused->apply(h, static_cast<float>(scale));  // writes the model-dtype copy too
      m.publish_params();
    }
  }
  // Zero the gradients for the next step.
  for (auto& g : m.unit_grad)
    if (g.defined()) g.zero_();  // (frozen units have none)
  m.grads_fresh = true;
  result.reduce_wait_ms = m.waited_ms;
  result.gather_wait_ms = m.waited_gather_ms;
  result.comm_wait_ms = m.waited_ms + m.waited_gather_ms;
  m.waited_ms = m.waited_gather_ms = 0;
  return result;
}

MemoryReport Engine::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  const int64_t elem = at::elementSize(m.dtype);
  for (size_t u = 0; u < m.unit_full.size(); ++u)
    if (m.resident[u]) r.params += m.layout.units()[u].padded * elem;
  for (const at::Tensor* shard : {&m.param_shard, &m.frozen_shard})
    if (shard->defined()) (m.params_on_host ? r.host_params : r.params) += shard->numel() * elem;
  for (const auto& g : m.unit_grad)
    if (g.defined()) r.grads += g.numel() * elem;
  if (m.grad_shard.defined()) r.grads += m.grad_shard.numel() * elem;
  r.master = m.master.numel() * 4;
  r.optimizer = (m.exp_avg.numel() + m.exp_avg_sq.numel()) * 4;
  // Frozen parameters count in the parameters only: no gradient, master weights or Adam states.
  const int64_t psi = m.layout.numel(), trained = psi - m.layout.frozen_numel(), n = m.world;
  const int stage = m.opt.stage;
  r.formula_params = stage == 3 ? psi * elem / n : psi * elem;
  r.formula_grads = stage >= 2 ? trained * elem / n : trained * elem;
  r.formula_optimizer = stage >= 1 ? 12 * trained / n : 12 * trained;  // fp32 master + exp_avg + exp_avg_sq
  return r;
}

std::string Engine::describe() const {
  const Impl& m = *impl_;
  const MemoryReport r = memory();
  auto mb = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  const std::string where =
      m.offload
          ? fmt::format(
                "offloaded to the CPU (fused Adam, {}; {} chunks{}{}{})", optim::fused_adam_isa(), m.offload_chunks.size(),
                !m.device.is_cuda() ? ""
                : m.opt.pin_memory  ? ", pinned, copies overlapped with the update"
                                    : ", pageable host memory (zero.pin_memory false): copies block",
                m.params_on_host ? fmt::format("; parameter shards in host memory, {:.2f} MiB", mb(r.host_params)) : "",
                m.opt.delayed_update ? "; delayed update: each step's update runs during the next step and is applied at its end" : "")
          : fmt::format("on {} (fused Adam, {})", m.device.str(), optim::fused_adam_kind(m.device));
  const std::string experts = m.ep > 1
                                  ? fmt::format(" (routed experts over {} ranks, {} per rank and layer, each expert data-parallel over {})",
                                                m.ep, m.model.local_experts().count, m.edp_world)
                                  : "";
  return fmt::format(
      "ZeRO stage {} on {} rank(s){}, {} {} units on {}, overlap_comm {}, optimizer {}; per rank: params {:.2f} MiB, "
      "grads {:.2f} MiB, master + Adam states {:.2f} MiB (ZeRO formula {:.2f} / {:.2f} / {:.2f} MiB){}",
      m.opt.stage, m.world, experts, m.layout.units().size(), config::name(m.opt.dtype), m.device.str(), m.opt.overlap_comm ? "on" : "off",
      where, mb(r.params), mb(r.grads), mb(r.master + r.optimizer), mb(r.formula_params), mb(r.formula_grads), mb(r.formula_optimizer),
      m.layout.frozen_numel() > 0 ? fmt::format("; {} frozen parameters: no gradients, master or Adam states; model states {:.1f} MiB",
                                                m.layout.frozen_numel(), mb(r.params + r.host_params + r.grads + r.master + r.optimizer))
                                  : "");
}

// A delayed update still running writes the master weights and moments: it finishes first.

}  // namespace dstrain::zero
