// libFuzzer target for the config readers: the input is a recipe YAML and a ds_config JSON
// (and an hf_config), split at NUL bytes, served from memory to the whole load pipeline.
// A clean Error is the expected answer to bad input; anything else (a crash, a hang, another
// exception type, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dstrain/config/load_context.h"
#include "dstrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string parts[3];
  size_t part = 0;
  for (char c : input) {
    if (c == '\0' && part < 2)
      ++part;
    else
      parts[part] += c;
  }
  // The recipe always points at the other two documents, so both readers are exercised.
  const std::string recipe = parts[0] + "\nds_config: ds.json\n";
  auto read = [&](const std::string& path) -> std::optional<std::string> {
    if (path.size() >= 11 && path.compare(path.size() - 11, 11, "recipe.yaml") == 0) return recipe;
    if (path.size() >= 7 && path.compare(path.size() - 7, 7, "ds.json") == 0) return parts[1];
    if (path.size() >= 7 && path.compare(path.size() - 7, 7, "hf.json") == 0) return parts[2];
    return std::nullopt;
  };
  try {
    dstrain::config::load_recipe_with("/fuzz/recipe.yaml", {}, read);
  } catch (const dstrain::Error&) {}
  return 0;
}
