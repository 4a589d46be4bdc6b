// Reads a recipe YAML file into a Recipe, collecting every problem with file:line:column.
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <map>

#include "dstrain/config/schema.h"
#include "dstrain/config/validate.h"
#include "dstrain/core/error.h"

namespace dstrain::config {
namespace {

struct Problems {
  std::string file;
  std::vector<std::string> items;
  void add(const YAML::Mark& mark, const std::string& message) {
    if (mark.is_null()) items.push_back(fmt::format("{}: {}", file, message));
    else items.push_back(fmt::format("{}:{}:{}: {}", file, mark.line + 1, mark.column + 1, message));
  }
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;  // suggest only close matches
  for (const auto& k : known) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

// Converts one scalar into the field's type; returns an error message or "".
std::string assign(const Field& field, const YAML::Node& node, Recipe& recipe) {
  if (!node.IsScalar()) return fmt::format("{}: expected a single value, found a {}", field.path, node.IsMap() ? "mapping" : "list");
  const std::string text = node.Scalar();
  auto target = field.target(recipe);
  if (auto* s = std::get_if<std::string*>(&target)) {
    if (!field.choices.empty() && std::find(field.choices.begin(), field.choices.end(), text) == field.choices.end())
      return fmt::format("{}: '{}' is not supported; allowed: {}", field.path, text, fmt::join(field.choices, ", "));
    **s = text;
    return "";
  }
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    return fmt::format("{}: expected a number, found '{}'", field.path, text);
  }
  if (!std::isfinite(value) || value < field.min || value > field.max)
    return fmt::format("{}: {} is out of range [{}, {}]", field.path, text, field.min, field.max);
  if (auto* d = std::get_if<double*>(&target)) {
    **d = value;
    return "";
  }
  if (value != std::floor(value)) return fmt::format("{}: expected a whole number, found '{}'", field.path, text);
  if (auto* i = std::get_if<int64_t*>(&target)) **i = static_cast<int64_t>(value);
  if (auto* u = std::get_if<uint64_t*>(&target)) **u = static_cast<uint64_t>(value);
  return "";
}

const Field* find_field(const std::string& path) {
  for (const auto& f : recipe_schema())
    if (f.path == path) return &f;
  return nullptr;
}

std::vector<std::string> keys_under(const std::string& section) {
  std::vector<std::string> keys;
  for (const auto& f : recipe_schema()) {
    const auto dot = f.path.find('.');
    if (section.empty() && dot == std::string::npos) keys.push_back(f.path);
    if (!section.empty() && dot != std::string::npos && f.path.compare(0, dot, section) == 0) keys.push_back(f.path.substr(dot + 1));
  }
  if (section.empty())
    for (const auto& s : recipe_sections()) keys.push_back(s);
  return keys;
}

void apply_override(YAML::Node& root, const std::string& spec, Problems& problems) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    problems.items.push_back(fmt::format("--set '{}': expected key.path=value, e.g. --set train.steps=20", spec));
    return;
  }
  const std::string path = spec.substr(0, eq);
  if (!find_field(path)) {
    std::vector<std::string> all;
    for (const auto& f : recipe_schema()) all.push_back(f.path);
    problems.items.push_back(fmt::format("--set {}: unknown key{}", path, did_you_mean(path, all)));
    return;
  }
  const auto dot = path.find('.');
  YAML::Node value(spec.substr(eq + 1));
  if (dot == std::string::npos) root[path] = value;
  else root[path.substr(0, dot)][path.substr(dot + 1)] = value;
}

void read_mapping(const YAML::Node& node, const std::string& section, Recipe& recipe, Problems& problems) {
  const auto known = keys_under(section);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string path = section.empty() ? key : section + "." + key;
    const auto sections = recipe_sections();
    if (section.empty() && std::find(sections.begin(), sections.end(), key) != sections.end()) {
      if (!kv.second.IsMap()) problems.add(kv.second.Mark(), fmt::format("{}: expected a mapping of keys", key));
      else read_mapping(kv.second, key, recipe, problems);
      continue;
    }
    const Field* field = find_field(path);
    if (!field) {
      problems.add(kv.first.Mark(), fmt::format("{}: unknown key{}", path, did_you_mean(key, known)));
      continue;
    }
    const std::string message = assign(*field, kv.second, recipe);
    if (!message.empty()) problems.add(kv.second.Mark(), message);
  }
}

}  // namespace

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(path))
    throw Error(ErrorCode::kConfig, fmt::format("recipe '{}' does not exist or is not a file", path),
                "pass the path of a recipe YAML file, e.g. recipes/demo.yaml");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCode::kConfig, fmt::format("{}:{}:{}: not valid YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg),
                "fix the YAML syntax at that position");
  }
  Problems problems{path, {}};
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw Error(ErrorCode::kConfig, fmt::format("{}: a recipe is a mapping of keys", path), "see recipes/demo.yaml");
  for (const auto& spec : overrides) apply_override(root, spec, problems);

  Recipe recipe;
  recipe.source_path = fs::absolute(path).lexically_normal().string();
  read_mapping(root, "", recipe, problems);

  // Paths: data is relative to the recipe file, run_dir to the current directory.
  if (recipe.data.path.empty()) problems.items.push_back(fmt::format("{}: data.path is required", path));
  else recipe.data.path = (fs::path(recipe.source_path).parent_path() / recipe.data.path).lexically_normal().string();
  if (recipe.run_dir.empty()) problems.items.push_back(fmt::format("{}: run_dir is required", path));
  else recipe.run_dir = fs::absolute(recipe.run_dir).lexically_normal().string();

  for (const auto& message : validate(recipe)) problems.items.push_back(fmt::format("{}: {}", path, message));
  if (!problems.items.empty()) {
    throw Error(ErrorCode::kConfig,
                fmt::format("{} problem{} in the recipe:\n  {}", problems.items.size(), problems.items.size() == 1 ? "" : "s",
                            fmt::join(problems.items, "\n  ")),
                "fix each one; `dstrain train --help` lists the keys and recipes/README.md explains them");
  }
  return recipe;
}

}  // namespace dstrain::config
