#include "dstrain/config/peft_adapter.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "dstrain/core/atomic_file.h"

namespace dstrain::config {

std::vector<std::string> peft_adapter_problems(const LoraConfig& lora, const std::string& source) {
  namespace fs = std::filesystem;
  const std::string dir = lora.init_from, where = fmt::format("lora.init_from ({})", source);
  std::vector<std::string> problems;
  for (const char* file : {"adapter_config.json", "adapter_model.safetensors"})
    if (!fs::is_regular_file(fs::path(dir) / file))
      problems.push_back(
          fmt::format("{}: '{}' has no {}: not a PEFT adapter folder (save_pretrained writes adapter_config.json and "
                      "adapter_model.safetensors)",
                      where, dir, file));
  if (!problems.empty()) return problems;
  const nlohmann::json c = nlohmann::json::parse(read_file(dir + "/adapter_config.json"), nullptr, false);
  if (!c.is_object()) return {fmt::format("{}: {}/adapter_config.json is not a JSON object", where, dir)};
  auto value = [&](const char* key) { return c.contains(key) ? c.at(key) : nlohmann::json(nullptr); };
  if (value("peft_type") != "LORA")
    problems.push_back(fmt::format("{}: the adapter's peft_type is {}, not LORA", where, value("peft_type").dump()));
  const nlohmann::json r = value("r"), alpha = value("lora_alpha"), rslora = value("use_rslora");
  if (!r.is_number_integer() || r.get<int64_t>() != lora.rank)
    problems.push_back(fmt::format("{}: the adapter's r is {}, lora.rank is {}: set lora.rank: {}", where, r.dump(), lora.rank, r.dump()));
  if (!alpha.is_number() || std::abs(alpha.get<double>() - lora.alpha) > 1e-12 * std::abs(lora.alpha))
    problems.push_back(fmt::format("{}: the adapter's lora_alpha is {}, lora.alpha is {:g}: set lora.alpha: {}", where, alpha.dump(),
                                   lora.alpha, alpha.dump()));
  if (rslora.is_boolean() && rslora.get<bool>() != lora.use_rslora)
    problems.push_back(fmt::format("{}: the adapter's use_rslora is {}, lora.use_rslora is {}", where, rslora.dump(), lora.use_rslora));
  if (value("use_dora").is_boolean() && value("use_dora").get<bool>() != lora.use_dora)
    problems.push_back(
        fmt::format("{}: the adapter's use_dora is {}, lora.use_dora is {}", where, value("use_dora").dump(), lora.use_dora));
  // Per-module ranks and alphas: the adapter's must be the recipe's (PEFT writes {} for none).
  const auto same_pattern = [&](const char* key, const auto& ours) {
    const nlohmann::json theirs = value(key).is_null() ? nlohmann::json::object() : value(key);
    bool same = theirs.is_object() && theirs.size() == ours.size();
    for (const auto& [pattern, v] : ours)
      same = same && theirs.contains(pattern) && theirs.at(pattern).is_number() &&
             std::abs(theirs.at(pattern).template get<double>() - static_cast<double>(v)) <= 1e-12 * std::abs(static_cast<double>(v));
    if (!same)
      problems.push_back(fmt::format("{}: the adapter's {} is {}, lora.{} is {}: set lora.{}: {}", where, key, theirs.dump(), key,
                                     nlohmann::json(ours).dump(), key, theirs.dump()));
  };
  same_pattern("rank_pattern", lora.rank_pattern);
  same_pattern("alpha_pattern", lora.alpha_pattern);
  return problems;
}

}  // namespace dstrain::config
