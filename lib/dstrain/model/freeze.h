#pragma once
// train.freeze: which parameters do not train. Each entry is a role (model/param_role.h:
// embeddings, attention, mlp, experts, router, norms, head, mtp) or a glob over Hugging Face
// parameter names (fnmatch: `*` also crosses dots, `[0-3]` a character class). Entries are
// matched against the whole model's global names (every expert, every pipeline stage), so that
// every rank freezes the same set whatever it holds.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

struct FrozenSet {
  std::set<std::string> names;        // global parameter names
  int64_t frozen = 0, total = 0;      // parameter elements of the whole model
  int64_t frozen_routers = 0;         // MoE routers frozen (their selection bias stops moving)
  std::vector<double> dense, routed;  // frozen elements by layer group (config::FrozenCounts)
  int64_t trainable() const { return total - frozen; }
};

// The parameters `patterns` freeze in a model of `config`. Throws Error{kConfig} naming
// train.freeze[i] for an entry that matches nothing (listing the roles and some names there
// are), and for a set that freezes every parameter.
FrozenSet frozen_set(const config::ModelConfig& config, const std::vector<std::string>& patterns);

// The recipe's frozen counts (config::LoadOptions::frozen_counts): train.freeze's, or lora's (model/lora.h).
config::FrozenCounts frozen_counts_of(const config::Recipe& recipe);

// Marks the model's parameters in `set` frozen (ParamPlace::trains false, no requires_grad).
void apply_frozen_set(CausalLM& model, const FrozenSet& set);

// One log line: what is frozen, what trains, and what a frozen router stops.
std::string describe_frozen(const config::ModelConfig& config, const FrozenSet& set);

}  // namespace dstrain::model
