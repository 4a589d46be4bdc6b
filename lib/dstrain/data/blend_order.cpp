#include "dstrain/data/blend_order.h"

namespace dstrain::data {

BlendOrder::BlendOrder(const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  for (double w : weights) weights_.push_back(w / total);
  counts_.assign(weights_.size(), 0);
}

size_t BlendOrder::source_of(int64_t position, int64_t& index_in_source) {
  if (weights_.size() == 1) return index_in_source = position, 0;
  if (position < next_) next_ = 0, counts_.assign(weights_.size(), 0);  // a jump back: replay
  size_t chosen = 0;
  while (next_ <= position) {
    double worst = -1e300;
    for (size_t s = 0; s < weights_.size(); ++s) {
      const double error = weights_[s] * static_cast<double>(next_ + 1) - static_cast<double>(counts_[s]);
      if (error > worst) worst = error, chosen = s;
    }
    index_in_source = counts_[chosen]++;
    ++next_;
  }
  return chosen;
}

}  // namespace dstrain::data
