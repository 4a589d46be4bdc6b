#pragma once
// Memory per rank for a resolved config: model states, activations and offload staging on the
// device and in host memory (the worst pipeline rank with a pipeline), and the largest model
// that fits a device: what --dry-run prints and the launcher checks before it starts anything.
#include "dstrain/config/recipe.h"

namespace dstrain::cost {

using config::Recipe;

// Memory per rank in the chosen mode (bytes): on the training device the model states, the
// activations and, with optimizer offload, the staging the step uses there (the fp32 gradient
// shard and the model-dtype copy of the updated shard); in host memory the offloaded states and
// the pinned gradient staging.
struct MemoryPlan {
  double device_states = 0, device_activations = 0, device_staging = 0;
  double host_states = 0, host_staging = 0;
  double device_total() const { return device_states + device_activations + device_staging; }
  double host_total() const { return host_states + host_staging; }
};
MemoryPlan memory_plan(const Recipe& recipe);
// The most parameters whose model states and staging fit in `device_bytes` beside this recipe's
// activations, at its stage, precision, offload and world size, keeping 10% for the allocator's
// fragmentation and workspaces: what "the biggest model that fits" means for the plan. 0 when
// the activations alone do not fit.
double largest_model_fitting(const Recipe& recipe, double device_bytes);

}  // namespace dstrain::cost
