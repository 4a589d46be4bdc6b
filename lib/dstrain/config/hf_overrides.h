#pragma once
// Which model keys a recipe or --set gives beside a Hugging Face config.json (model.hf_config,
// or the one model.init_from implies): they override that field of the file, and when the
// weights then do not fit, they are what to name.
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// "model.max_seq_len 2048 (--set)", one per model.* key set beside config.json; empty without one.
std::vector<std::string> model_keys_over_hf_config(const Recipe& r);

// What to do when init_from's weights do not fit the model: drop those overrides, or fix the
// folder's config.json (or the recipe's sizes, without one).
std::string init_weights_hint(const Recipe& r);

}  // namespace dstrain::config
