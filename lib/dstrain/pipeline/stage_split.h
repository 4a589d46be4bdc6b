#pragma once
// Which decoder layers each pipeline stage holds: the contiguous split that balances the stages'
// cost, the embedding counted on the first stage and the head (final norm, LM head, loss) on the
// last (torchtitan's first/last-stage weights, here costs of their own), or a split given by hand.
#include <string>
#include <vector>

namespace dstrain::pipeline {

struct LayerCosts {
  std::vector<double> layers;  // each decoder layer's cost, in model order
  double embedding = 0;        // joins the first stage
  double head = 0;             // joins the last stage
};

// The split of the decoder layers into `stages` contiguous, non-empty runs whose most expensive
// stage is the cheapest possible; among equal ones, the earliest cut points. The layer count of
// each stage. Throws Error{kConfig} when there are fewer layers than stages.
std::vector<int> balanced_split(const LayerCosts& costs, int stages);

// Each stage's cost under a split (layer counts that add up to the layers).
std::vector<double> stage_costs(const LayerCosts& costs, const std::vector<int>& layers_per_stage);

// What is wrong with a split given by hand for `layers` layers and `stages` stages, "" if
// nothing: one count per stage, each at least 1, adding up to the layers.
std::string split_problem(const std::vector<int>& layers_per_stage, int layers, int stages);

}  // namespace dstrain::pipeline
