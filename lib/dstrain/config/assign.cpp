#include "dstrain/config/assign.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <type_traits>

namespace dstrain::config {
namespace {

bool parse_double(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(out);
}

std::string check_number(const Field& f, double v, const std::string& text, bool whole) {
  if (whole && v != std::floor(v)) return fmt::format("{}: expected a whole number, found '{}'", f.path, text);
  if (v < f.min || v > f.max) return fmt::format("{}: {} is out of range [{:g}, {:g}]", f.path, text, f.min, f.max);
  return "";
}

std::string check_choice(const Field& f, const std::string& v) {
  if (f.choices.empty() || std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end()) return "";
  return fmt::format("{}: '{}' is not supported; allowed: {}", f.path, v, fmt::join(f.choices, ", "));
}

std::string read_stages(const Field& f, const Node& node, std::vector<AccumulationStage>& out, bool lax) {
  if (node.kind != Node::Kind::kArray || node.items.empty())
    return fmt::format("{}: expected a list of stages like [{{until_step: 1000, steps: 8}}, {{steps: 16}}], found a {}", f.path,
                       node.kind_name());
  std::vector<AccumulationStage> stages;
  for (size_t i = 0; i < node.items.size(); ++i) {
    const Node& item = node.items[i];
    if (!item.is_object())
      return fmt::format("{}[{}]: expected a mapping {{until_step: N, steps: A}}, found a {}", f.path, i, item.kind_name());
    AccumulationStage stage;
    bool has_steps = false;
    for (const auto& [key, value] : item.members) {
      double v = 0;
      if (key != "until_step" && key != "until_tokens" && key != "steps")
        return fmt::format("{}[{}].{}: unknown key{}", f.path, i, key, did_you_mean(key, {"until_step", "until_tokens", "steps"}));
      const double max = key == "until_tokens" ? 9e15 : f.max;
      if (!node_number(value, lax, v) || v != std::floor(v) || v < 1 || v > max)
        return fmt::format("{}[{}].{}: expected a whole number in [1, {:g}], found '{}'", f.path, i, key, max, value.text);
      if (key == "steps")
        stage.steps = static_cast<int64_t>(v), has_steps = true;
      else if (key == "until_tokens")
        stage.until_tokens = static_cast<int64_t>(v);
      else
        stage.until_step = static_cast<int64_t>(v);
    }
    if (stage.until_step && stage.until_tokens) return fmt::format("{}[{}]: give until_step or until_tokens, not both", f.path, i);
    if (stage.until_tokens) {  // checked again in steps once the batch is known
      const bool last = i + 1 == node.items.size();
      if (last) return fmt::format("{}[{}]: the last stage runs to the end; remove its until_tokens", f.path, i);
      stages.push_back(stage);
      continue;
    }
    if (!has_steps) return fmt::format("{}[{}]: 'steps' (the accumulation steps of the stage) is missing", f.path, i);
    const bool last = i + 1 == node.items.size();
    if (!last && stage.until_step == 0)
      return fmt::format("{}[{}]: every stage but the last needs until_step (or until_tokens)", f.path, i);
    if (last && stage.until_step != 0) return fmt::format("{}[{}]: the last stage runs to the end; remove its until_step", f.path, i);
    if (!stages.empty() && stage.until_step != 0 && stages.back().until_tokens == 0 && stage.until_step <= stages.back().until_step)
      return fmt::format("{}[{}]: until_step {} must be greater than the previous stage's {}", f.path, i, stage.until_step,
                         stages.back().until_step);
    stages.push_back(stage);
  }
  out = std::move(stages);
  return "";
}

}  // namespace

bool node_number(const Node& node, bool lax, double& out) {
  if (node.kind == Node::Kind::kNumber) return parse_double(node.text, out);
  if (lax && node.kind == Node::Kind::kString) return parse_double(node.text, out);
  return false;
}

bool node_bool(const Node& node, bool lax, bool& out) {
  if (node.kind == Node::Kind::kBool) return out = node.text == "true", true;
  if (!lax) return false;
  std::string t = node.text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (node.kind == Node::Kind::kString || node.kind == Node::Kind::kNumber) {
    if (t == "true" || t == "yes" || t == "on" || t == "1" || t == "y" || t == "t") return out = true, true;
    if (t == "false" || t == "no" || t == "off" || t == "0" || t == "n" || t == "f") return out = false, true;
  }
  return false;
}

namespace {
struct AssignVisitor {
  const Field& f;
  const Node& node;
  bool lax;
  std::string operator()(int64_t* p) const { return integer(p); }
  std::string operator()(uint64_t* p) const { return integer(p); }
  template <typename T>
  std::string integer(T* p) const {
    double v = 0;
    if (!node_number(node, lax, v)) return fmt::format("{}: expected a whole number, found {} '{}'", f.path, node.kind_name(), node.text);
    const std::string problem = check_number(f, v, node.text, true);
    if (problem.empty()) *p = static_cast<T>(v);
    return problem;
  }
  std::string operator()(double* p) const {
    double v = 0;
    if (!node_number(node, lax, v)) return fmt::format("{}: expected a number, found {} '{}'", f.path, node.kind_name(), node.text);
    const std::string problem = check_number(f, v, node.text, false);
    if (problem.empty()) *p = v;
    return problem;
  }
  std::string operator()(bool* p) const {
    bool v = false;
    if (!node_bool(node, lax, v)) return fmt::format("{}: expected true or false, found {} '{}'", f.path, node.kind_name(), node.text);
    *p = v;
    return "";
  }
  std::string operator()(std::string* p) const {
    if (node.kind == Node::Kind::kNull || node.kind == Node::Kind::kArray || node.kind == Node::Kind::kObject)
      return fmt::format("{}: expected a single value, found a {}", f.path, node.kind_name());
    const std::string problem = check_choice(f, node.text);
    if (problem.empty()) *p = node.text;
    return problem;
  }
  std::string operator()(std::vector<double>* p) const {
    if (node.kind != Node::Kind::kArray) return fmt::format("{}: expected a list of numbers, found a {}", f.path, node.kind_name());
    std::vector<double> out;
    for (const auto& item : node.items) {
      double v = 0;
      if (!node_number(item, lax, v)) return fmt::format("{}: expected numbers, found {} '{}'", f.path, item.kind_name(), item.text);
      if (const auto problem = check_number(f, v, item.text, false); !problem.empty()) return problem;
      out.push_back(v);
    }
    *p = std::move(out);
    return "";
  }
  std::string operator()(std::vector<std::string>* p) const {
    if (node.kind != Node::Kind::kArray) return fmt::format("{}: expected a list, found a {}", f.path, node.kind_name());
    std::vector<std::string> out;
    for (const auto& item : node.items) {
      if (item.kind == Node::Kind::kArray || item.kind == Node::Kind::kObject || item.kind == Node::Kind::kNull)
        return fmt::format("{}: expected names, found a {}", f.path, item.kind_name());
      if (const auto problem = check_choice(f, item.text); !problem.empty()) return problem;
      if (std::find(out.begin(), out.end(), item.text) == out.end()) out.push_back(item.text);
    }
    *p = std::move(out);
    return "";
  }
  std::string operator()(std::vector<AccumulationStage>* p) const { return read_stages(f, node, *p, lax); }
  template <typename T>
  std::string operator()(std::map<std::string, T>* p) const {
    if (node.kind == Node::Kind::kNull) return p->clear(), "";
    if (node.kind != Node::Kind::kObject)
      return fmt::format("{}: expected a mapping {{pattern: value, ...}}, found a {}", f.path, node.kind_name());
    std::map<std::string, T> out;
    for (const auto& [key, item] : node.members) {
      double v = 0;
      if (key.empty()) return fmt::format("{}: an empty pattern", f.path);
      if (!node_number(item, lax, v))
        return fmt::format("{}: {}: expected a number, found {} '{}'", f.path, key, item.kind_name(), item.text);
      if (const auto problem = check_number(f, v, item.text, std::is_integral_v<T>); !problem.empty()) return problem + " (" + key + ")";
      out[key] = static_cast<T>(v);
    }
    *p = std::move(out);
    return "";
  }
  std::string operator()(const EnumTarget& t) const {
    std::string name;
    if (const std::string problem = operator()(&name); !problem.empty()) return problem;
    t.set(choice_index(name));
    return "";
  }
  std::string operator()(const EnumListTarget& t) const {
    std::vector<std::string> names;
    if (const std::string problem = operator()(&names); !problem.empty()) return problem;
    std::vector<size_t> values;
    for (const auto& name : names) values.push_back(choice_index(name));
    t.set(values);
    return "";
  }
  size_t choice_index(const std::string& name) const {
    return static_cast<size_t>(std::find(f.choices.begin(), f.choices.end(), name) - f.choices.begin());
  }
};
}  // namespace

std::string assign_node(const Field& f, const Node& node, Recipe& recipe, bool lax) {
  return std::visit(AssignVisitor{f, node, lax}, f.target(recipe));
}

}  // namespace dstrain::config
