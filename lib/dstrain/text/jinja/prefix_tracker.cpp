#include "dstrain/text/jinja/prefix_tracker.h"

#include <algorithm>

namespace dstrain::text::jinja {

PrefixTracker::PrefixTracker(size_t messages) : n_(messages), tree_(messages + 1, -1) {}

void PrefixTracker::track_list(const Value& list, size_t offset) {
  lists_[&list.as_list()] = offset;
  if (offset > 0) kept_.push_back(list);
}

int64_t PrefixTracker::offset_of(const Value& v) const {
  if (v.kind() != Value::Kind::kList) return -1;
  const auto it = lists_.find(&v.as_list());
  return it == lists_.end() ? -1 : static_cast<int64_t>(it->second);
}

void PrefixTracker::observe(size_t i) {
  const auto at = static_cast<int64_t>(std::min(i, n_));
  if (unit_ >= 0)
    unit_observed_ = std::max(unit_observed_, at);
  else
    outside_ = std::max(outside_, at);
}

void PrefixTracker::begin_unit(size_t i) {
  unit_ = static_cast<int64_t>(i);
  unit_observed_ = -1;
}

void PrefixTracker::end_unit(bool changed_something) {
  if (changed_something) last_changing_unit_ = std::max(last_changing_unit_, unit_);
  for (size_t x = static_cast<size_t>(unit_) + 1; x < tree_.size(); x += x & (~x + 1)) tree_[x] = std::max(tree_[x], unit_observed_);
  unit_ = -1;
}

int64_t PrefixTracker::max_observed_before(size_t k) const {
  int64_t m = -1;
  for (size_t x = std::min(k, n_); x > 0; x -= x & (~x + 1)) m = std::max(m, tree_[x]);
  return m;
}

bool PrefixTracker::resumable(size_t k) const {
  const auto kk = static_cast<int64_t>(k);
  return !untracked_ && outside_ < kk && last_changing_unit_ < kk && max_observed_before(k) < kk;
}

}  // namespace dstrain::text::jinja
