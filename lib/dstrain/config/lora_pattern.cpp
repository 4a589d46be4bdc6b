#include "dstrain/config/lora_pattern.h"

#include <fmt/format.h>

#include <regex>

#include "dstrain/core/error.h"

namespace dstrain::config {

bool lora_pattern_matches(const std::string& pattern, const std::string& module, const char* key) {
  try {
    return std::regex_match(module, std::regex("(.*\\.)?(" + pattern + ")"));
  } catch (const std::regex_error& e) {
    throw Error(ErrorCode::kConfig, fmt::format("lora.{}: '{}' is no regular expression ({})", key, pattern, e.what()),
                "write the module's name (model.layers.0.self_attn.q_proj) or a regular expression over it");
  }
}

}  // namespace dstrain::config
