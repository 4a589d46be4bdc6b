#include "dstrain/zero/engine_impl.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "dstrain/core/error.h"
#include "dstrain/device/pinned_memory.h"

namespace dstrain::zero {

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

bool storage_present(const at::Tensor& t) { return t.storage().nbytes() > 0; }

c10::Stream current_stream(const at::Device& device) { return c10::impl::getDeviceGuardImpl(device.type())->getStream(device); }

void timed_wait(comm::Work& work, double& waited_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  work.wait();
  waited_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Engine::Impl::Impl(model::CausalLM& m, comm::Communicator& c, const EngineOptions& o, const ExpertGroups& x)
    : model(m), comm(c), opt(o), rank(c.rank()), world(c.world_size()), shard_world(o.stage == 0 ? 1 : c.world_size()),
      dtype(model::scalar_type(o.dtype)), device(o.device), optim_device(o.offload_optimizer ? at::Device(at::kCPU) : o.device),
      offload(o.offload_optimizer), params_on_host(o.offload_param && o.stage == 3 && o.offload_optimizer), experts(checked_groups(c, x)),
      ep(experts.parallel ? experts.parallel->world_size() : 1), ep_rank(experts.parallel ? experts.parallel->rank() : 0),
      edp_world(experts.data ? experts.data->world_size() : world), edp_rank(experts.data ? experts.data->rank() : rank),
      layout(layout_params(m, ep > 1), shard_world, std::max<int64_t>(1, o.reduce_bucket_size), o.stage == 0 ? 1 : edp_world,
             m.num_groups()),
      segments(layout.segments(o.stage == 0 ? 0 : rank, o.stage == 0 ? 0 : edp_rank)),
      scaler(o.dtype == config::Dtype::kFp16 ? o.loss_scaler : LossScalerConfig{1.0}) {
  for (const comm::Communicator* group : {static_cast<const comm::Communicator*>(&c), static_cast<const comm::Communicator*>(experts.data)})
    if (group && group->device() != o.device)
      throw Error(ErrorCode::kInternal,
                  fmt::format("the ZeRO engine trains on {} but its {} communicator works on {}", o.device.str(), group->backend(),
                              group->device().str()),
                  "this is a dstrain bug; please report it");
}

ExpertGroups Engine::Impl::checked_groups(const comm::Communicator& c, const ExpertGroups& x) {
  if (!x.parallel && !x.data) return {};
  if (!x.parallel || !x.data || x.parallel->world_size() * x.data->world_size() != c.world_size())
    throw Error(ErrorCode::kInternal, "the ZeRO engine's expert groups do not partition its ranks",
                "this is a dstrain bug; please report it");
  if (x.parallel->world_size() == 1) return {};
  return x;
}

at::Tensor Engine::Impl::state_buffer(int64_t n, bool copied) const {
  if (copied && offload) return host_buffer(n, at::kFloat, "the offloaded fp32 master weights").zero_();
  return at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(optim_device));
}

at::Tensor Engine::Impl::host_buffer(int64_t n, at::ScalarType t, const char* what) const {
  if (device.is_cuda() && opt.pin_memory) return device::pinned_empty(n, t, what);
  return at::empty({n}, at::TensorOptions().dtype(t));
}

std::vector<Layout::Param> Engine::Impl::layout_params(const model::CausalLM& m, bool expert_parallel) {
  const std::vector<model::ParamPlace>& places = m.parameter_places();
  const model::NamedTensors& params = m.parameters();
  if (places.size() != params.size())
    throw Error(ErrorCode::kInternal, fmt::format("the model declares {} parameter places for {} parameters", places.size(), params.size()),
                "this is a dstrain bug; please report it");
  std::vector<Layout::Param> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({params[i].name, params[i].tensor.numel(), places[i].group, places[i].decays(), expert_parallel && places[i].expert >= 0,
                   places[i].trains});
  return out;
}

std::string Engine::Impl::name_on(size_t index, int target) const {
  const int64_t j = model.parameter_places()[index].expert;
  if (j < 0 || target == ep_rank) return model.parameters()[index].name;
  return model.expert_parameter_name(index, j + target * model.local_experts().count);
}

void Engine::Impl::build() {
  c10::NoGradGuard no_grad;
  for (const auto& p : model.parameters()) params.push_back(p.tensor);
  const auto& units = layout.units();
  units_of_group.assign(static_cast<size_t>(layout.num_groups()), {});
  master = state_buffer(layout.shard_numel(), /*copied=*/true);
  if (opt.stage >= 2) grad_shard = at::zeros({layout.shard_numel()}, on_device(dtype));
  if (opt.stage == 3) {
    param_shard = params_on_host ? host_buffer(layout.shard_numel(), dtype, "the offloaded parameter shard (offload_param)").zero_()
                                 : at::zeros({layout.shard_numel()}, on_device(dtype));
    if (layout.frozen_shard_numel() > 0)
      frozen_shard = params_on_host ? host_buffer(layout.frozen_shard_numel(), dtype, "the offloaded frozen parameters").zero_()
                                    : at::zeros({layout.frozen_shard_numel()}, on_device(dtype));
  }
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const Unit& u = units[ui];
    units_of_group[static_cast<size_t>(u.group)].push_back(static_cast<int>(ui));
    at::Tensor full = at::zeros({u.padded}, on_device(dtype));
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
      const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
      at::Tensor& p = params[static_cast<size_t>(i)];
      full.narrow(0, slot.offset, slot.numel).copy_(p.reshape({-1}));
      p.set_data(full.narrow(0, slot.offset, slot.numel).view(p.sizes()));
      if (!u.trains) p.requires_grad_(false);
    }
    // The fp32 master starts from the model-dtype values, as DeepSpeed's does; a frozen unit has
    // none (and no gradient buffer): at stage 3 its chunk is kept in the frozen shard.
    if (u.trains) master.narrow(0, u.shard_offset, u.chunk()).copy_(full.narrow(0, my_chunk_start(u), u.chunk()));
    if (opt.stage == 3) shard_of(u).narrow(0, u.shard_offset, u.chunk()).copy_(full.narrow(0, my_chunk_start(u), u.chunk()));
    if (!u.trains) {
      if (opt.stage <= 1) unit_grad.emplace_back();
    } else if (opt.stage <= 1) {
      at::Tensor grad = at::zeros({u.padded}, on_device(dtype));
      for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
        const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
        at::Tensor& p = params[static_cast<size_t>(i)];
        p.mutable_grad() = grad.narrow(0, slot.offset, slot.numel).view(p.sizes());
      }
      unit_grad.push_back(grad);
    }
    // Stage 3: a unit whose parameters are all small stays resident (persistence threshold).
    bool small = opt.stage == 3;
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i)
      small = small && layout.params()[static_cast<size_t>(i)].numel < opt.persistence_threshold;
    resident.push_back(opt.stage != 3 || small);
    unit_full.push_back(full);
    gathering.emplace_back();
  }
  if (opt.stage == 3)
    for (size_t ui = 0; ui < units.size(); ++ui)
      if (!resident[ui]) free_storage(unit_full[ui]);
  // The Adam moments after the loop, which has freed the model's own parameter memory (offloaded,
  // both live in host memory: the peak is one of them lower).
  exp_avg = state_buffer(layout.shard_numel());
  exp_avg_sq = state_buffer(layout.shard_numel());
  if (offload) {
    published = opt.stage == 3 ? param_shard : master.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
    // The gradient shard comes down in the model dtype (half the bytes of fp32 in bf16), to pinned
    // memory, where the CPU update reads it (and, on a GPU, writes the updated weights over it).
    if (device.is_cuda() || opt.delayed_update)  // delayed: the gradients must outlive the step
      host_grads = host_buffer(layout.shard_numel(), dtype, "the offloaded gradient staging");
    if (opt.delayed_update) staged = host_buffer(layout.shard_numel(), dtype, "the delayed update's parameters");
    // Whole segments: the CPU kernel sees exactly the calls it would without offload
    // (bit-identical results), and the copy of chunk k+1 overlaps the update of chunk k.
    int64_t elements = 0;
    for (size_t first = 0, i = 0; i < segments.size(); ++i) {
      elements += segments[i].numel;
      if (elements >= std::max<int64_t>(1, opt.offload_chunk) || i + 1 == segments.size()) {
        offload_chunks.emplace_back(first, i + 1);
        first = i + 1;
        elements = 0;
      }
    }
  }
  if (opt.stage != 3 && !offload && world > 1 && opt.stage > 0) model_shard = at::zeros({layout.shard_numel()}, on_device(dtype));
  const std::vector<optim::StepRun> runs = step_runs();
  fused = std::make_unique<optim::FusedStep>(device, dtype, runs);
  if (ep > 1) plan_expert_norm(runs);
}

void Engine::Impl::plan_expert_norm(const std::vector<optim::StepRun>& runs) {
  const model::CausalLM::ExpertBlock block = model.local_experts();
  if (block.count <= 0 || block.first != ep_rank * block.count)
    throw Error(ErrorCode::kInternal,
                fmt::format("expert-parallel rank {} of {} holds experts [{}, {}): the model was not built for this group", ep_rank, ep,
                            block.first, block.first + block.count),
                "this is a dstrain bug; please report it");
  if (opt.stage != 0) return;
  std::vector<optim::StepRun> counted;
  for (size_t i = 0; i < segments.size(); ++i)
    if (layout.params()[static_cast<size_t>(segments[i].param)].expert ? edp_rank == 0 : rank == 0) counted.push_back(runs[i]);
  norm_counts_none = counted.empty();
  if (!counted.empty() && counted.size() < runs.size()) norm_only = std::make_unique<optim::FusedStep>(device, dtype, counted);
}

at::Tensor Engine::Impl::counted_sum_squares(const at::Tensor& all) const {
  if (replicated_norm()) return step_world && rank == 0 ? all : at::zeros_like(all);  // over stages: each stage's once
  if (norm_counts_none) return at::zeros_like(all);
  return norm_only ? norm_only->grad_sum_squares_tensor().to(all.device()) : all;
}

std::vector<optim::StepRun> Engine::Impl::step_runs() {
  std::vector<optim::StepRun> runs;
  const int64_t esz = at::elementSize(dtype);
  for (const ShardSegment& s : segments) {
    const ParamSlot& slot = layout.params()[static_cast<size_t>(s.param)];
    const auto u = static_cast<size_t>(slot.unit);
    const int64_t in_unit = slot.offset + s.param_offset;  // in the unit's full buffer
    optim::StepRun r;
    r.n = s.numel;
    r.decay = s.decay;
    r.grad = opt.stage <= 1 ? static_cast<const char*>(unit_grad[u].data_ptr()) + in_unit * esz
                            : static_cast<const char*>(grad_shard.data_ptr()) + s.shard_offset * esz;
    if (!offload) {
      r.master = master.data_ptr<float>() + s.shard_offset;
      r.exp_avg = exp_avg.data_ptr<float>() + s.shard_offset;
      r.exp_avg_sq = exp_avg_sq.data_ptr<float>() + s.shard_offset;
      const at::Tensor& shard = opt.stage == 3 ? param_shard : model_shard;
      r.param_out = shard.defined() ? static_cast<char*>(shard.data_ptr()) + s.shard_offset * esz
                                    : static_cast<char*>(unit_full[u].data_ptr()) + in_unit * esz;
    }
    runs.push_back(r);
  }
  return runs;
}

}  // namespace dstrain::zero
