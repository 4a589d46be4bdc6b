#include "dstrain/data/global_sampler.h"

#include <cstddef>
#include <algorithm>
#include <numeric>
#include <utility>

namespace dstrain::data {
namespace {

// splitmix64: a tiny, well-mixed generator whose output is the same on every platform
// (std::shuffle's is not specified).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

GlobalSampler::GlobalSampler(int64_t num_samples, uint64_t seed) : num_samples_(num_samples), seed_(seed) {}

int64_t GlobalSampler::sample_at(int64_t position) {
  const int64_t epoch = position / num_samples_;
  if (epoch != cached_epoch_) {
    permutation_.resize(static_cast<size_t>(num_samples_));
    std::iota(permutation_.begin(), permutation_.end(), 0);
    uint64_t state = seed_ ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
    for (int64_t i = num_samples_ - 1; i > 0; --i) {  // Fisher-Yates
      const auto j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[static_cast<size_t>(i)], permutation_[static_cast<size_t>(j)]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(position % num_samples_)];
}

int64_t first_position(int64_t batch_start, int64_t micro_step, int64_t micro_batch, int64_t rank, int64_t world) {
  return batch_start + (micro_step * world + rank) * micro_batch;
}

}  // namespace dstrain::data

namespace dstrain::data {

std::vector<int64_t> weighted_shares(int64_t global_batch, const std::vector<double>& weights) {
  const size_t n = weights.size();
  double total = 0;
  for (double w : weights) total += w > 0 ? w : 0;
  std::vector<int64_t> counts(n, 0);
  if (n == 0) return counts;
  if (total <= 0) return weighted_shares(global_batch, std::vector<double>(n, 1.0));
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t r = 0; r < n; ++r) {
    const double exact = static_cast<double>(global_batch) * std::max(0.0, weights[r]) / total;
    counts[r] = static_cast<int64_t>(exact);
    given += counts[r];
    remainders.push_back({exact - static_cast<double>(counts[r]), r});
  }
  std::stable_sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < global_batch; ++i, ++given) counts[remainders[i % n].second] += 1;
  // No idle rank while the batch has samples to spare: take one from the largest share.
  for (size_t r = 0; r < n && global_batch >= static_cast<int64_t>(n); ++r)
    if (counts[r] == 0) {
      const auto largest = std::max_element(counts.begin(), counts.end());
      --*largest, counts[r] = 1;
    }
  return counts;
}

}  // namespace dstrain::data
