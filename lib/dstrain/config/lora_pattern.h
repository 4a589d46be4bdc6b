#pragma once
// PEFT's rule for lora.rank_pattern and lora.alpha_pattern (peft.utils.other.get_pattern_key): a
// pattern is a regular expression matched against a module's whole name as (.*\.)?(pattern), so
// `q_proj`, `self_attn.q_proj` and `model.layers.0.self_attn.q_proj` all name that projection.
#include <string>

namespace dstrain::config {

// ECMAScript's syntax, which agrees with Python's for the usual patterns. `key` (rank_pattern or
// alpha_pattern) names the setting in the error: Error{kConfig} for a pattern that does not parse.
bool lora_pattern_matches(const std::string& pattern, const std::string& module, const char* key);

}  // namespace dstrain::config
