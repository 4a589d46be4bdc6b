#pragma once
// What each rank says at the end of a step, summed over all ranks in the engine's one scalar
// all-reduce (zero::Engine::step's `sums`): whether it wants a checkpoint or a stop at this step
// boundary. Summed, save and stop mean "some rank
// asked", so every rank takes the same decision without another collective.
// The step's other control data rides the same all-reduce (issue 26: on GPUs that is NCCL, not
// a Gloo ring of N hops): MoE expert load, and on the steps that need them every rank's
// straggler times and data rates, each rank filling only its own slots so that the sum is an
// all-gather.
#include <cstddef>
#include <vector>

namespace dstrain::train {

struct StepSignals {
  bool save = false;
  bool stop = false;

  std::vector<double> pack() const { return {save ? 1.0 : 0.0, stop ? 1.0 : 0.0}; }
  static StepSignals unpack(const std::vector<double>& sums) { return {sums.at(0) > 0, sums.at(1) > 0}; }
};

// Segments of the step's summed values. Every rank must add the same segments in the same order.
class StepSums {
 public:
  // Appends values summed as they are; returns the segment's index.
  size_t add(const std::vector<double>& values) {
    starts_.push_back(values_.size());
    values_.insert(values_.end(), values.begin(), values.end());
    return starts_.size() - 1;
  }
  // Appends world x mine.size() values, zero but for this rank's row: summed, row r is rank r's.
  size_t add_row(int rank, int world, const std::vector<double>& mine) {
    std::vector<double> rows(static_cast<size_t>(world) * mine.size(), 0.0);
    for (size_t i = 0; i < mine.size(); ++i) rows[static_cast<size_t>(rank) * mine.size() + i] = mine[i];
    return add(rows);
  }
  const std::vector<double>& values() const { return values_; }
  // Segment `index` of the summed values.
  std::vector<double> segment(const std::vector<double>& summed, size_t index) const {
    const size_t begin = starts_.at(index), end = index + 1 < starts_.size() ? starts_[index + 1] : values_.size();
    return std::vector<double>(summed.begin() + static_cast<std::ptrdiff_t>(begin), summed.begin() + static_cast<std::ptrdiff_t>(end));
  }

 private:
  std::vector<double> values_;
  std::vector<size_t> starts_;
};

}  // namespace dstrain::train
