#include "dstrain/zero/engine_impl.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "dstrain/core/error.h"

namespace dstrain::zero {

void Engine::Impl::start_gather(int group) {
  for (int ui : units_of_group[static_cast<size_t>(group)]) {
    const auto u = static_cast<size_t>(ui);
    if (resident[u] || gathering[u] || storage_present(unit_full[u])) continue;
    const Unit& unit = layout.units()[u];
    allocate_storage(unit_full[u]);
    gathering[u] = comm_of(unit).all_gather(on_device_copy(shard_of(unit).narrow(0, unit.shard_offset, unit.chunk())), unit_full[u]);
  }
}

void Engine::Impl::finish_gather(int group) {
  start_gather(group);
  for (int ui : units_of_group[static_cast<size_t>(group)]) {
    auto& work = gathering[static_cast<size_t>(ui)];
    if (work) {
      timed_wait(*work, waited_gather_ms);
      work.reset();
    }
  }
}

void Engine::Impl::release(int group) {
  for (int ui : units_of_group[static_cast<size_t>(group)])
    if (!resident[static_cast<size_t>(ui)] && !gathering[static_cast<size_t>(ui)]) free_storage(unit_full[static_cast<size_t>(ui)]);
}

int64_t Engine::Impl::group_numel(int group) const {
  int64_t n = 0;
  for (int ui : units_of_group[static_cast<size_t>(group)]) n += layout.units()[static_cast<size_t>(ui)].padded;
  return n;
}

void Engine::Impl::prefetch(int group) {
  if (opt.overlap_comm && group >= 0 && group < layout.num_groups() && group_numel(group) <= opt.prefetch_bucket_size) start_gather(group);
}

void Engine::Impl::flush(MicroState& micro, int group) {
  if (micro.flushed[static_cast<size_t>(group)]) return;
  micro.flushed[static_cast<size_t>(group)] = true;
  if (opt.stage <= 1 && !micro.last) return;
  std::vector<Pending>& pending = micro.pending;
  for (int ui : units_of_group[static_cast<size_t>(group)]) {
    const auto u = static_cast<size_t>(ui);
    const Unit& unit = layout.units()[u];
    if (!unit.trains) continue;  // frozen: nothing to reduce
    comm::Communicator& group_comm = comm_of(unit);
    const bool shared = ranks_of(unit) > 1;
    if (opt.stage == 0) {
      if (shared) pending.push_back({group_comm.all_reduce(unit_grad[u]), {}, ui});
      continue;
    }
    if (opt.stage == 1) {  // in place: this rank's chunk of the full buffer receives the sum
      at::Tensor mine = unit_grad[u].narrow(0, my_chunk_start(unit), unit.chunk());
      if (shared) pending.push_back({group_comm.reduce_scatter(unit_grad[u], mine), {}, ui});
      continue;
    }
    at::Tensor input;
    {  // copy the micro-batch's gradients into one contiguous bucket and drop them
      input = at::zeros({unit.padded}, on_device(dtype));
      for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
        const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
        at::Tensor& p = params[static_cast<size_t>(i)];
        if (p.grad().defined()) {
          input.narrow(0, slot.offset, slot.numel).copy_(p.grad().reshape({-1}));
          p.mutable_grad().reset();
        }
      }
    }
    at::Tensor received = at::empty({unit.chunk()}, on_device(dtype));
    if (shared) {
      pending.push_back({group_comm.reduce_scatter(input, received), received, ui});
    } else {
      received.copy_(input);
      pending.push_back({nullptr, received, ui});
    }
  }
  if (opt.stage == 3 && group != last_group()) release(group);
}

void Engine::Impl::drain(MicroState& micro) {
  std::vector<Pending>& pending = micro.pending;
  for (Pending& p : pending) {
    if (p.work) timed_wait(*p.work, waited_ms);
    if (!p.received.defined()) continue;
    const Unit& unit = layout.units()[static_cast<size_t>(p.unit)];
    at::Tensor slot = grad_shard.narrow(0, unit.shard_offset, unit.chunk());
    if (grads_fresh)
      slot.copy_(p.received);
    else
      slot.add_(p.received);
  }
  if (!pending.empty() && opt.stage >= 1) grads_fresh = false;
  pending.clear();
}

void Engine::Impl::drain_all() {
  for (const MicroBatch& micro : undrained) drain(*micro);
  undrained.clear();
}

void Engine::Impl::publish_params() {
  const auto& units = layout.units();
  const at::Tensor& source = offload ? published : opt.stage == 3 ? param_shard : model_shard;
  if (!source.defined()) return;  // stage 0 or one rank: written in place
  std::vector<Pending> pending;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    if (!unit.trains) continue;  // frozen: unchanged
    const at::Tensor mine = source.narrow(0, unit.shard_offset, unit.chunk());
    if (opt.stage == 3 && !resident[u]) continue;
    if (opt.stage == 0 || ranks_of(unit) == 1) {
      unit_full[u].narrow(0, my_chunk_start(unit), unit.chunk()).copy_(mine);
      continue;
    }
    pending.push_back({comm_of(unit).all_gather(on_device_copy(mine), unit_full[u]), {}, -1});
  }
  for (auto& pend : pending) timed_wait(*pend.work, waited_gather_ms);
}

void Engine::Impl::before_group(int group) {
  if (opt.step_boundary_comm) return;
  if (opt.stage == 3) {
    finish_gather(group);
    if (c10::GradMode::is_enabled()) prefetch(group + 1);
  }
}

at::Tensor Engine::Impl::after_group(int group, const at::Tensor& output) {
  if (opt.step_boundary_comm) return output;
  const bool training = c10::GradMode::is_enabled() && output.requires_grad();
  if (!training) {
    if (opt.stage == 3) release(group);
    return output;
  }
  if (opt.stage == 3 && group != last_group()) release(group);
  if (group == last_group()) return output;
  if (!current)
    throw Error(ErrorCode::kInternal, "a training forward ran outside the engine's begin_micro() .. end_micro()",
                "this is a dstrain bug; please report it");
  // Backward reaches this output only after the next group's backward (and its parameters'
  // gradient accumulation) is complete: reduce that group now, and bring this one back. The
  // hook holds its own micro-batch's state.
  output.register_hook([this, group, micro = current](const at::Tensor&) {
    if (opt.overlap_comm) flush(*micro, group + 1);
    if (opt.stage == 3) {
      finish_gather(group);
      prefetch(group - 1);
    }
  });
  return output;
}
MicroBatch Engine::begin_micro(bool last) {
  Impl& m = *impl_;
  auto micro = std::make_shared<MicroState>();
  micro->last = last;
  micro->flushed.assign(static_cast<size_t>(m.layout.num_groups()), false);
  gather_for_forward();  // step_boundary_comm at stage 3: the step's parameters, all at once
  m.current = micro;
  m.undrained.push_back(micro);
  return micro;
}

void Engine::gather_for_forward() {
  Impl& m = *impl_;
  if (!m.opt.step_boundary_comm || m.opt.stage != 3) return;
  for (int g = 0; g < m.layout.num_groups(); ++g) m.start_gather(g);
  for (int g = 0; g < m.layout.num_groups(); ++g) m.finish_gather(g);
}

void Engine::release_after_forward() {
  Impl& m = *impl_;
  if (!m.opt.step_boundary_comm || m.opt.stage != 3) return;
  for (int g = 0; g < m.layout.num_groups(); ++g) m.release(g);
}

void Engine::end_micro(const MicroBatch& micro) {
  Impl& m = *impl_;
  // Whatever backward did not flush yet (everything without overlap_comm), in group order from
  // the last: the same order on every rank.
  for (int g = m.layout.num_groups() - 1; g >= 0; --g) m.flush(*micro, g);
  if (m.opt.stage >= 2) {
    m.drain(*micro);
    m.undrained.erase(std::remove(m.undrained.begin(), m.undrained.end(), micro), m.undrained.end());
  }
  if (m.opt.stage == 3) m.release(m.last_group());
  if (m.current == micro) m.current.reset();
}

}  // namespace dstrain::zero
