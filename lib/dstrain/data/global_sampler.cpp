#include "dstrain/data/global_sampler.h"

#include <cstddef>
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
