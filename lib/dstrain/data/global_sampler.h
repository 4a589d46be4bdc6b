#pragma once
// One global sample order that does not depend on the world size. Sample i of the file is the
// window tokens[i*seq_len, i*seq_len + seq_len + 1). Each epoch is a seeded permutation of all
// samples; position p in the global order is epoch p / n, slot p % n. A rank only decides which
// positions it reads, so resuming on any number of ranks continues with the same next sample.
#include <cstdint>
#include <vector>

namespace dstrain::data {

class GlobalSampler {
 public:
  GlobalSampler(int64_t num_samples, uint64_t seed);
  int64_t num_samples() const { return num_samples_; }
  // The sample index at global position `position`.
  int64_t sample_at(int64_t position);

 private:
  int64_t num_samples_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// The first global position that rank `rank` reads in micro-step `micro_step` of an optimizer
// step whose global batch starts at position `batch_start` (the samples consumed before it):
// the batch is cut into micro-batches of `micro_batch` samples, dealt out rank-major within
// each micro-step.
int64_t first_position(int64_t batch_start, int64_t micro_step, int64_t micro_batch, int64_t rank, int64_t world);

}  // namespace dstrain::data

namespace dstrain::data {

// Heterogeneous ranks: how many of a step's `global_batch` samples each rank takes, in
// proportion to `weights` (largest remainder, ties to the lower rank; every rank gets at least
// one when the batch allows). Rank r reads the contiguous positions
// [batch_start + sum of earlier counts, + counts[r]), so the union is the global batch whatever
// the weights.
std::vector<int64_t> weighted_shares(int64_t global_batch, const std::vector<double>& weights);

}  // namespace dstrain::data
