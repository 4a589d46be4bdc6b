#include "dstrain/zero/engine_impl.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <map>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/error.h"

namespace dstrain::zero {

std::vector<Engine::ShardRun> Engine::shard_runs() const {
  impl_->join_delayed();
  return impl_->runs(/*saved_only=*/false);
}

std::vector<Engine::ShardRun> Engine::saved_shard_runs() const {
  impl_->join_delayed();
  return impl_->runs(/*saved_only=*/true);
}

int Engine::shard_writers() const {
  const Impl& m = *impl_;
  // Stage 0: rank 0, and with expert parallelism ranks 0..E-1 (the first of each block's holders).
  return m.opt.stage == 0 ? m.ep : m.world;
}

std::vector<Engine::ShardRun> Engine::Impl::runs(bool saved_only) const {
  const Impl& m = *this;
  std::vector<ShardRun> out;
  // The checkpointer reads and writes host memory: a shard on a GPU goes through host copies,
  // refreshed here and uploaded again by publish_loaded_shard().
  const at::Tensor* states[] = {&m.master, &m.exp_avg, &m.exp_avg_sq};
  if (!m.master.is_cpu()) {
    for (int i = 0; i < 3; ++i) m.mirror[i] = states[i]->to(at::kCPU);
    m.mirrored = true;
    for (int i = 0; i < 3; ++i) states[i] = &m.mirror[i];
  }
  const std::pair<const char*, const at::Tensor*> kinds[] = {{"", states[0]}, {"exp_avg.", states[1]}, {"exp_avg_sq.", states[2]}};
  for (const auto& [prefix, shard] : kinds)
    for (const ShardSegment& s : m.segments) {
      const ParamSlot& slot = m.layout.params()[static_cast<size_t>(s.param)];
      // Stage 0 replicates every run over its group: the group's first rank saves it.
      if (saved_only && m.opt.stage == 0 && (slot.expert ? m.edp_rank : m.rank) != 0) continue;
      out.push_back({prefix + slot.name, s.param_offset, s.numel, shard->data_ptr<float>() + s.shard_offset});
    }
  // The frozen parameters: their values alone (no optimizer state), widened to fp32 into the mirror.
  const std::vector<FrozenPiece> pieces = m.frozen_pieces(saved_only);
  int64_t total = 0;
  for (const FrozenPiece& p : pieces) total += p.numel;
  m.frozen_mirror = at::empty({total}, at::kFloat);
  int64_t at_offset = 0;
  for (const FrozenPiece& p : pieces) {
    at::Tensor into = m.frozen_mirror.narrow(0, at_offset, p.numel);
    into.copy_(p.values.reshape({-1}));
    out.push_back({m.layout.params()[static_cast<size_t>(p.param)].name, p.param_offset, p.numel, into.data_ptr<float>()});
    at_offset += p.numel;
  }
  return out;
}

std::vector<Engine::Impl::FrozenPiece> Engine::Impl::frozen_pieces(bool saved_only) const {
  std::vector<FrozenPiece> out;
  if (layout.frozen_numel() == 0 || !opt.checkpoint_frozen) return out;
  if (opt.stage == 3) {  // this rank's chunks, in the frozen shard
    for (const ShardSegment& s : layout.segments(rank, edp_rank, /*trained=*/false))
      out.push_back({s.param, s.param_offset, s.numel, frozen_shard.narrow(0, s.shard_offset, s.numel)});
    return out;
  }
  // Stages 0-2 hold every frozen unit whole: each rank loads them whole; the chunks a rank saves
  // are its own (stage 0: the whole of its group's first rank's).
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Unit& unit = layout.units()[u];
    if (unit.trains) continue;
    int64_t lo = 0, hi = unit.padded;
    if (saved_only && opt.stage == 0 && place_of(unit) != 0) continue;
    if (saved_only && opt.stage > 0) lo = place_of(unit) * unit.chunk(), hi = lo + unit.chunk();
    for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
      const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
      const int64_t a = std::max(lo, slot.offset), b = std::min(hi, slot.offset + slot.numel);
      if (a < b) out.push_back({i, a - slot.offset, b - a, unit_full[u].narrow(0, a, b - a)});
    }
  }
  return out;
}

void Engine::Impl::publish_loaded_frozen() {
  if (!frozen_mirror.defined()) return;
  int64_t at_offset = 0;
  for (const FrozenPiece& p : frozen_pieces(/*saved_only=*/false)) {
    p.values.copy_(frozen_mirror.narrow(0, at_offset, p.numel).to(p.values.device()));
    at_offset += p.numel;
  }
  frozen_mirror = at::Tensor();
  if (opt.stage != 3) return;
  // Stage 3: the resident frozen units are gathered again from the loaded chunks (the others on demand).
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Unit& unit = layout.units()[u];
    if (unit.trains || !resident[u]) continue;
    const at::Tensor mine = frozen_shard.narrow(0, unit.shard_offset, unit.chunk());
    if (ranks_of(unit) == 1)
      unit_full[u].narrow(0, my_chunk_start(unit), unit.chunk()).copy_(mine);
    else
      timed_wait(*comm_of(unit).all_gather(on_device_copy(mine), unit_full[u]), waited_gather_ms);
  }
}

ckpt::ShardTable Engine::shard_table() const {
  const Layout& layout = impl_->layout;
  ckpt::ShardTable t;
  t.ranks = layout.world_size();
  t.prefixes = {"", "exp_avg.", "exp_avg_sq."};  // shard_runs()' order
  for (const Unit& u : layout.units()) {
    ckpt::ShardTable::Unit unit{u.chunk(), {}};
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
      const ParamSlot& p = layout.params()[static_cast<size_t>(i)];
      unit.params.push_back({p.name, p.offset, p.numel});
    }
    t.units.push_back(std::move(unit));
  }
  return t;
}

// The table describes units whose parameters all have the three states: none with frozen ones.
bool Engine::has_shard_table() const { return !shard_replicated() && impl_->ep == 1 && impl_->layout.frozen_numel() == 0; }

std::vector<Engine::StateTensor> Engine::state_tensors() const {
  const Impl& m = *impl_;
  // The model's parameters in order; with expert parallelism each run of this rank's expert
  // parameters stands for every rank's block, in expert order (the unsharded model's order).
  std::vector<StateTensor> params;
  const model::NamedTensors& mine = m.model.parameters();
  std::vector<bool> trains;
  auto is_expert = [&](size_t i) { return m.ep > 1 && m.model.parameter_places()[i].expert >= 0; };
  for (size_t i = 0; i < mine.size();) {
    size_t end = i + 1;
    const bool expert = is_expert(i);
    while (expert && end < mine.size() && is_expert(end)) ++end;
    for (int target = 0; target < (expert ? m.ep : 1); ++target)
      for (size_t k = i; k < end; ++k) {
        params.push_back({m.name_on(k, target), "float32", mine[k].tensor.sizes().vec()});
        trains.push_back(m.model.parameter_places()[k].trains);
      }
    i = end;
  }
  std::vector<StateTensor> out;
  for (const std::string prefix : {"", "exp_avg.", "exp_avg_sq."})
    for (size_t k = 0; k < params.size(); ++k)
      if (trains[k] || (prefix.empty() && m.opt.checkpoint_frozen))
        out.push_back({prefix + params[k].name, params[k].dtype, params[k].shape});  // frozen: values alone
  return out;
}

bool Engine::shard_replicated() const { return impl_->opt.stage == 0 || impl_->world == 1; }

std::vector<double> EngineState::values() const {
  return {scaler.scale, static_cast<double>(scaler.iter), static_cast<double>(scaler.last_overflow_iter),
          static_cast<double>(scaler.hysteresis_left), static_cast<double>(skipped_steps)};
}

EngineState EngineState::from_values(const std::vector<double>& v) {
  if (static_cast<int64_t>(v.size()) != kValues)
    throw Error(ErrorCode::kCheckpoint, fmt::format("engine.state holds {} values, not {}", v.size(), kValues),
                "the checkpoint was written by another dstrain");
  EngineState s;
  s.scaler.scale = v[0];
  s.scaler.iter = static_cast<int64_t>(v[1]);
  s.scaler.last_overflow_iter = static_cast<int64_t>(v[2]);
  s.scaler.hysteresis_left = static_cast<int64_t>(v[3]);
  s.skipped_steps = static_cast<int64_t>(v[4]);
  return s;
}

model::NamedTensors Engine::state() const {
  const std::vector<double> values = EngineState{impl_->scaler.state(), skipped_}.values();
  return {{"engine.state", at::tensor(values, at::kDouble)}};
}

void Engine::load_state(const model::NamedTensors& state) {
  const at::Tensor t = state.at(0).tensor.to(at::kDouble).contiguous();
  const EngineState s = EngineState::from_values(std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel()));
  if (impl_->opt.dtype == config::Dtype::kFp16) impl_->scaler.set_state(s.scaler);
  skipped_ = s.skipped_steps;
}

void Engine::publish_loaded_shard() {
  c10::NoGradGuard no_grad;
  Impl& m = *impl_;
  m.join_delayed();
  m.update_pending = false;  // the loaded state replaces what it computed
  if (m.mirrored) {
    at::Tensor* states[] = {&m.master, &m.exp_avg, &m.exp_avg_sq};
    for (int i = 0; i < 3; ++i) states[i]->copy_(m.mirror[i]), m.mirror[i] = at::Tensor();
    m.mirrored = false;
  }
  if (m.offload)
    m.published.copy_(m.master);
  else
    m.fused->write_params();
  m.publish_params();
  m.publish_loaded_frozen();
}

void Engine::mix_from(const Engine& source, double alpha) {
  c10::NoGradGuard no_grad;
  Impl& m = *impl_;
  Impl& s = *source.impl_;
  if (m.params.size() != s.params.size() || m.layout.num_groups() != s.layout.num_groups())
    throw Error(ErrorCode::kInternal, "mix_from: the two engines' models differ in shape", "this is a dstrain bug; please report it");
  const bool gathered = m.opt.stage == 3;
  for (int g = 0; g < m.layout.num_groups(); ++g) {
    if (gathered) m.finish_gather(g), s.finish_gather(g);
    for (int ui : m.units_of_group[static_cast<size_t>(g)]) {
      const Unit& unit = m.layout.units()[static_cast<size_t>(ui)];
      if (unit.trains) throw Error(ErrorCode::kInternal, "mix_from into parameters that train", "this is a dstrain bug; please report it");
      for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i)
        m.params[static_cast<size_t>(i)].mul_(1.0 - alpha).add_(s.params[static_cast<size_t>(i)], alpha);
      if (gathered)  // this rank's chunk, where the next gather reads it
        m.shard_of(unit)
            .narrow(0, unit.shard_offset, unit.chunk())
            .copy_(m.unit_full[static_cast<size_t>(ui)].narrow(0, m.my_chunk_start(unit), unit.chunk()));
    }
    if (gathered) m.release(g), s.release(g);
  }
}

void Engine::drop_host_copies() {
  for (auto& m : impl_->mirror) m = at::Tensor();
  impl_->mirrored = false;
  impl_->frozen_mirror = at::Tensor();
}

model::NamedTensors Engine::full_state() const {
  model::NamedTensors out;
  for (const StateTensor& t : state_tensors()) out.push_back({t.name, at::zeros(t.shape, at::kFloat)});
  return out;
}

void Engine::gather_full_state(const model::NamedTensors& full) {
  Impl& m = *impl_;
  c10::NoGradGuard no_grad;
  m.join_delayed();
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& t : full) by_name[t.name] = &t.tensor;
  const std::pair<const char*, const at::Tensor*> kinds[] = {{"", &m.master}, {"exp_avg.", &m.exp_avg}, {"exp_avg_sq.", &m.exp_avg_sq}};
  for (const auto& [prefix, shard] : kinds) {
    for (size_t u = 0; u < m.layout.units().size(); ++u) {
      const Unit& unit = m.layout.units()[u];
      if (!unit.trains && (*prefix || !m.opt.checkpoint_frozen)) continue;  // frozen: values alone, or nothing
      at::Tensor whole = at::empty({unit.padded}, m.on_device(at::kFloat));
      // A frozen unit's values: held whole below stage 3, else this rank's chunk of the frozen shard.
      const at::Tensor source = unit.trains ? *shard : m.opt.stage == 3 ? m.frozen_shard : m.unit_full[u];
      const int64_t from = unit.trains || m.opt.stage == 3 ? unit.shard_offset : m.my_chunk_start(unit);
      const at::Tensor mine = source.narrow(0, from, unit.chunk()).to(m.device, at::kFloat).contiguous();
      if (m.opt.stage == 0 || m.ranks_of(unit) == 1)
        whole.copy_(mine);
      else
        m.comm_of(unit).all_gather(mine, whole)->wait();
      // An expert unit: every expert-parallel rank's block of the same shape, in rank order.
      std::vector<at::Tensor> blocks{whole};
      if (unit.expert) {
        at::Tensor all = at::empty({m.ep * unit.padded}, m.on_device(at::kFloat));
        m.experts.parallel->all_gather(whole, all)->wait();
        blocks = all.chunk(m.ep);
      }
      if (full.empty()) continue;
      for (size_t target = 0; target < blocks.size(); ++target)
        for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
          const ParamSlot& slot = m.layout.params()[static_cast<size_t>(i)];
          const std::string name = prefix + (unit.expert ? m.name_on(static_cast<size_t>(i), static_cast<int>(target)) : slot.name);
          by_name.at(name)->view({-1}).copy_(blocks[target].narrow(0, slot.offset, slot.numel));
        }
    }
  }
}

}  // namespace dstrain::zero
