#include "dstrain/config/lora_pattern.h"

#include <fmt/format.h>

#include <map>
#include <regex>

#include "dstrain/core/error.h"

namespace dstrain::config {

bool lora_pattern_matches(const std::string& pattern, const std::string& module, const char* key) {
  // Compiled once per pattern (per thread): a model's every projection, every routed expert's
  // included, is matched against the same few patterns.
  thread_local std::map<std::string, std::regex> compiled;
  try {
    auto it = compiled.find(pattern);
    if (it == compiled.end()) it = compiled.emplace(pattern, std::regex("(.*\\.)?(" + pattern + ")")).first;
    return std::regex_match(module, it->second);
  } catch (const std::regex_error& e) {
    throw Error(ErrorCode::kConfig, fmt::format("lora.{}: '{}' is no regular expression ({})", key, pattern, e.what()),
                "write the module's name (model.layers.0.self_attn.q_proj) or a regular expression over it");
  }
}

}  // namespace dstrain::config
