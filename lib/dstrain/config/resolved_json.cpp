// config.resolved.json: the canonical form of a Recipe that workers read. nlohmann stays here.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>

#include "dstrain/config/schema.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"

namespace dstrain::config {

void to_json(nlohmann::json& j, const AccumulationStage& s) { j = {{"until_step", s.until_step}, {"steps", s.steps}}; }
void from_json(const nlohmann::json& j, AccumulationStage& s) {
  j.at("until_step").get_to(s.until_step);
  j.at("steps").get_to(s.steps);
}

namespace {

constexpr int kFormatVersion = 2;

// nlohmann's conversions for plain targets; enum fields are written and read as their names.
template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

nlohmann::json field_json(const Field& f, Recipe& r) {
  return std::visit(
      Overloaded{[](auto* p) { return nlohmann::json(*p); }, [&](const EnumTarget& e) { return nlohmann::json(f.choices.at(e.get())); },
                 [&](const EnumListTarget& e) {
                   nlohmann::json names = nlohmann::json::array();
                   for (size_t i : e.get()) names.push_back(f.choices.at(i));
                   return names;
                 }},
      f.target(r));
}

size_t choice_of(const Field& f, const std::string& name) {
  const auto it = std::find(f.choices.begin(), f.choices.end(), name);
  if (it == f.choices.end()) throw nlohmann::json::other_error::create(501, f.path + ": unknown value '" + name + "'", nullptr);
  return static_cast<size_t>(it - f.choices.begin());
}

void read_field(const Field& f, const nlohmann::json& value, Recipe& r) {
  std::visit(Overloaded{[&](auto* p) { value.get_to(*p); }, [&](const EnumTarget& e) { e.set(choice_of(f, value.get<std::string>())); },
                        [&](const EnumListTarget& e) {
                          std::vector<size_t> values;
                          for (const auto& name : value.get<std::vector<std::string>>()) values.push_back(choice_of(f, name));
                          e.set(values);
                        }},
             f.target(r));
}

nlohmann::json values_json(const Recipe& recipe) {
  nlohmann::json j = nlohmann::json::object();  // std::map keys: sorted, hence canonical
  Recipe r = recipe;                            // the schema's targets are mutable pointers
  for (const auto& f : recipe_schema()) {
    nlohmann::json* slot = &j;
    const auto dot = f.path.find('.');
    if (dot != std::string::npos) slot = &j[f.path.substr(0, dot)];
    const std::string key = dot == std::string::npos ? f.path : f.path.substr(dot + 1);
    (*slot)[key] = field_json(f, r);
  }
  j["source_path"] = recipe.source_path;
  return j;
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string to_canonical_json(const Recipe& recipe) { return values_json(recipe).dump(); }

std::string config_hash(const Recipe& recipe) { return fmt::format("{:016x}", fnv1a64(to_canonical_json(recipe))); }

void write_resolved_config(const Recipe& recipe, const std::string& path) {
  nlohmann::json doc;
  doc["format_version"] = kFormatVersion;
  doc["config"] = values_json(recipe);
  doc["config_hash"] = config_hash(recipe);
  doc["sources"] = recipe.sources;
  write_file_atomic(path, doc.dump(2) + "\n");
}

Recipe read_resolved_config(const std::string& path) {
  const std::string text = read_file(path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, fmt::format("{}: not valid JSON: {}", path, e.what()),
                "this file is written by the launcher; start the run again with `dstrain train`");
  }
  if (!doc.is_object() || doc.value("format_version", 0) != kFormatVersion)
    throw Error(ErrorCode::kConfig,
                fmt::format("{}: format_version {} is not {}", path, doc.is_object() ? doc.value("format_version", 0) : 0, kFormatVersion),
                "it was written by another dstrain version; use the same dstrain binary for launcher and workers");
  // The hash covers the config as the file holds it (nlohmann dumps objects with sorted keys, the
  // canonical form), so a file written before a key existed still verifies.
  const std::string want = doc.value("config_hash", "");
  const std::string got = doc.contains("config") ? fmt::format("{:016x}", fnv1a64(doc.at("config").dump())) : "";
  if (want != got)
    throw Error(ErrorCode::kConfig, fmt::format("{}: config hash {} does not match its content ({})", path, want, got),
                "the resolved config was edited or corrupted; start the run again with `dstrain train`");
  Recipe recipe;
  std::vector<std::string> added_since;
  try {
    const auto& c = doc.at("config");
    for (const auto& f : recipe_schema()) {
      const auto dot = f.path.find('.');
      const bool new_section = dot != std::string::npos && !c.contains(f.path.substr(0, dot));  // e.g. moe
      const auto* section = dot == std::string::npos || new_section ? &c : &c.at(f.path.substr(0, dot));
      const std::string key = dot == std::string::npos ? f.path : f.path.substr(dot + 1);
      if (new_section || !section->contains(key)) {
        added_since.push_back(f.path);
        continue;
      }
      read_field(f, section->at(key), recipe);
    }
    recipe.source_path = c.at("source_path").get<std::string>();
    if (doc.contains("sources")) doc.at("sources").get_to(recipe.sources);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, fmt::format("{}: missing or mistyped entry: {}", path, e.what()),
                "this file is written by the launcher; do not edit it, start the run again instead");
  }
  // A key added to dstrain after this run started keeps its default, which by convention is the
  // behaviour from before the key existed (e.g. model.rope_scaling = none).
  for (const auto& key : added_since) recipe.sources[key] = "default (not in " + path + ": written by an earlier dstrain)";
  return recipe;
}

}  // namespace dstrain::config
