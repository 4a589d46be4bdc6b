#pragma once
// What each rank says at the end of a step, summed over all ranks in the engine's one scalar
// all-reduce (zero::Engine::step's `sums`): its part of the global mean loss, and whether it
// wants a checkpoint or a stop at this step boundary. Summed, save and stop mean "some rank
// asked", so every rank takes the same decision without another collective.
#include <vector>

namespace dstrain::train {

struct StepSignals {
  double loss = 0;
  bool save = false;
  bool stop = false;

  std::vector<double> pack() const { return {loss, save ? 1.0 : 0.0, stop ? 1.0 : 0.0}; }
  static StepSignals unpack(const std::vector<double>& sums) { return {sums.at(0), sums.at(1) > 0, sums.at(2) > 0}; }
};

}  // namespace dstrain::train
