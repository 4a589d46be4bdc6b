#include "dstrain/config/hf_overrides.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dstrain/config/schema.h"

namespace dstrain::config {

std::vector<std::string> model_keys_over_hf_config(const Recipe& r) {
  std::vector<std::string> keys;
  if (r.model.hf_config.empty()) return keys;
  Recipe copy = r;  // value_text reads through the schema's mutable field targets
  for (const Field& f : recipe_schema()) {
    if (f.path.rfind("model.", 0) != 0 || f.path == "model.hf_config" || f.path == "model.init_from") continue;
    const auto it = r.sources.find(f.path);
    if (it == r.sources.end()) continue;
    const std::string& source = it->second;
    // Values the file gave (or its model_type's defaults) name the file; defaults and derived values override nothing.
    if (source.rfind("default", 0) == 0 || source.rfind("derived", 0) == 0 || source.find(r.model.hf_config) != std::string::npos) continue;
    keys.push_back(fmt::format("{} {} ({})", f.path, value_text(f, copy), source));
  }
  return keys;
}

std::string init_weights_hint(const Recipe& r) {
  const std::string& dir = r.model.init_from;
  if (r.model.hf_config.empty())
    return fmt::format("{} has no config.json, so the recipe's sizes are the model: set them as the weights were trained", dir);
  const auto keys = model_keys_over_hf_config(r);
  if (!keys.empty())
    return fmt::format("{} override{} {}: drop {} (a size that changes a tensor's shape cannot differ from the weights')",
                       fmt::join(keys, ", "), keys.size() == 1 ? "s" : "", r.model.hf_config, keys.size() == 1 ? "it" : "them");
  if (r.model.hf_config.rfind(dir + "/", 0) != 0)
    return fmt::format("model.hf_config {} does not describe the weights in {}: point it at their config.json, or drop it",
                       r.model.hf_config, dir);
  return fmt::format("{} does not describe the weights beside it: export the folder again, or fix its config.json", r.model.hf_config);
}

}  // namespace dstrain::config
