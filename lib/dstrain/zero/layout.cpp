#include "dstrain/zero/layout.h"

#include <algorithm>
#include <stdexcept>

namespace dstrain::zero {

Layout::Layout(const std::vector<Param>& params, int world_size, int64_t max_unit_elements, int expert_world_size, int num_groups)
    : world_(world_size), expert_world_(expert_world_size > 0 ? expert_world_size : world_size), num_groups_(num_groups) {
  if (world_size < 1 || max_unit_elements < 1 || expert_world_size < 0)
    throw std::invalid_argument("zero::Layout: world sizes and max_unit_elements must be >= 1");
  int previous = 0;
  for (const auto& in : params) {
    if (in.group < previous || in.group < 0) throw std::invalid_argument("zero::Layout: parameter groups must not decrease: " + in.name);
    previous = in.group;
    num_groups_ = std::max(num_groups_, in.group + 1);
    ParamSlot slot;
    slot.name = in.name;
    slot.numel = in.numel;
    slot.group = in.group;
    slot.decay = in.decay;
    slot.expert = in.expert;
    slot.trains = in.trains;
    params_.push_back(slot);
    numel_ += in.numel;
    if (!in.trains) frozen_numel_ += in.numel;
  }
  auto close_unit = [&](Unit& u) {
    u.world = u.expert ? expert_world_ : world_;
    const int64_t quantum = static_cast<int64_t>(u.world) * kAlignment;
    u.padded = std::max<int64_t>(quantum, (u.numel + quantum - 1) / quantum * quantum);
    u.flat_offset = flat_;
    int64_t& shard = u.trains ? shard_ : frozen_shard_;
    u.shard_offset = shard;
    flat_ += u.padded;
    shard += u.chunk();
    units_.push_back(u);
  };
  Unit current;
  bool open = false;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    ParamSlot& p = params_[static_cast<size_t>(i)];
    if (open && (p.group != current.group || p.expert != current.expert || p.trains != current.trains ||
                 current.numel + p.numel > max_unit_elements)) {
      close_unit(current);
      open = false;
    }
    if (!open) {
      current = Unit{};
      current.group = p.group;
      current.expert = p.expert;
      current.trains = p.trains;
      current.first_param = i;
      open = true;
    }
    p.unit = static_cast<int>(units_.size());
    p.offset = current.numel;
    current.numel += p.numel;
    ++current.num_params;
  }
  if (open) close_unit(current);
}

std::vector<ShardSegment> Layout::segments(int rank, int expert_rank, bool trained) const {
  std::vector<ShardSegment> out;
  for (const Unit& u : units_) {
    if (u.trains != trained) continue;
    const int place = u.expert && expert_rank >= 0 ? expert_rank : rank;
    const int64_t lo = static_cast<int64_t>(place) * u.chunk(), hi = lo + u.chunk();
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
      const ParamSlot& p = params_[static_cast<size_t>(i)];
      const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
      if (a < b) out.push_back({i, u.shard_offset + (a - lo), a - p.offset, b - a, p.decay});
    }
  }
  return out;
}

}  // namespace dstrain::zero
