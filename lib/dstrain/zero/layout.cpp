#include "dstrain/zero/layout.h"

#include <algorithm>
#include <stdexcept>

namespace dstrain::zero {

namespace {
// The number that follows `key` up to the next dot ("layers." in "model.layers.3.mlp" -> 3), or -1.
int index_after(const std::string& name, const std::string& key) {
  const auto at = name.find(key);
  if (at == std::string::npos) return -1;
  const auto start = at + key.size();
  const auto end = name.find('.', start);
  const std::string digits = name.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return -1;
  return std::stoi(digits);
}
}  // namespace

int layer_index_of(const std::string& name) { return index_after(name, "layers."); }

int expert_index_of(const std::string& name) { return index_after(name, ".mlp.experts."); }

bool decays(const std::string& name, int64_t ndim) {
  auto ends_with = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ndim >= 2 && !ends_with(".bias") && !ends_with("e_score_correction_bias");
}

Layout::Layout(const std::vector<Param>& params, int world_size, int64_t max_unit_elements, int expert_world_size)
    : world_(world_size), expert_world_(expert_world_size > 0 ? expert_world_size : world_size) {
  if (world_size < 1 || max_unit_elements < 1 || expert_world_size < 0)
    throw std::invalid_argument("zero::Layout: world sizes and max_unit_elements must be >= 1");
  int num_layers = 0;
  for (const auto& p : params) num_layers = std::max(num_layers, layer_index_of(p.name) + 1);
  num_groups_ = num_layers + 2;
  for (const auto& in : params) {
    ParamSlot slot;
    slot.name = in.name;
    slot.numel = in.numel;
    const int layer = layer_index_of(in.name);
    slot.group = in.name.find("embed_tokens") != std::string::npos ? 0 : layer >= 0 ? layer + 1 : num_layers + 1;
    slot.decay = decays(in.name, in.ndim);
    slot.expert = in.expert;
    params_.push_back(slot);
    numel_ += in.numel;
  }
  auto close_unit = [&](Unit& u) {
    u.world = u.expert ? expert_world_ : world_;
    const int64_t quantum = static_cast<int64_t>(u.world) * kAlignment;
    u.padded = std::max<int64_t>(quantum, (u.numel + quantum - 1) / quantum * quantum);
    u.flat_offset = flat_;
    u.shard_offset = shard_;
    flat_ += u.padded;
    shard_ += u.chunk();
    units_.push_back(u);
  };
  Unit current;
  bool open = false;
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    ParamSlot& p = params_[static_cast<size_t>(i)];
    if (open && (p.group != current.group || p.expert != current.expert || current.numel + p.numel > max_unit_elements)) {
      close_unit(current);
      open = false;
    }
    if (!open) {
      current = Unit{};
      current.group = p.group;
      current.expert = p.expert;
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

std::vector<ShardSegment> Layout::segments(int rank, int expert_rank) const {
  std::vector<ShardSegment> out;
  for (const Unit& u : units_) {
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
