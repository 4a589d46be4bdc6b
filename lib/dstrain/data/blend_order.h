#pragma once
// Which source each global position of a weighted blend reads: position p goes to the source
// whose share of the first p + 1 positions is furthest behind its weight (Megatron's blending
// rule: never more than one sample off), as that source's next sample. Pretraining windows
// (SampleStream) and fine-tuning rows (train/fine_tuning_data.h) blend by it. Fast when positions
// grow; a jump back replays the assignment from the start.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dstrain::data {

class BlendOrder {
 public:
  // `weights`: one per source, > 0 (normalised here).
  explicit BlendOrder(const std::vector<double>& weights);
  size_t sources() const { return weights_.size(); }
  // The source of global position `position`, and in `index_in_source` how many of that
  // source's positions come before it.
  size_t source_of(int64_t position, int64_t& index_in_source);

 private:
  std::vector<double> weights_;  // normalised
  int64_t next_ = 0;             // positions [0, next_) are assigned
  std::vector<int64_t> counts_;  // ... this many to each source
};

}  // namespace dstrain::data
