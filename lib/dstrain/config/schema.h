#pragma once
// The recipe schema as data: one row per key. The YAML reader, the --set overrides, the canonical
// JSON writer and reader, --dry-run and recipes/README.md (checked by a test) all use this table.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// An enum field (config/enums.h) and a list of them, seen through their names: a value is its
// index in the field's choices, which are enum_names<E>().
struct EnumTarget {
  std::function<size_t()> get;
  std::function<void(size_t)> set;
};
struct EnumListTarget {
  std::function<std::vector<size_t>()> get;
  std::function<void(const std::vector<size_t>&)> set;
};
template <typename E>
EnumTarget enum_target(E& field) {
  return {[&field] { return static_cast<size_t>(field); }, [&field](size_t i) { field = static_cast<E>(i); }};
}
template <typename E>
EnumListTarget enum_target(std::vector<E>& field) {
  return {[&field] {
            std::vector<size_t> out;
            for (E e : field) out.push_back(static_cast<size_t>(e));
            return out;
          },
          [&field](const std::vector<size_t>& values) {
            field.clear();
            for (size_t i : values) field.push_back(static_cast<E>(i));
          }};
}

// Maps of names to numbers (lora.rank_pattern): written {name: value, ...}; min and max bound the values.
using FieldTarget = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<double>*, std::vector<std::string>*,
                                 std::vector<AccumulationStage>*, EnumTarget, EnumListTarget, std::map<std::string, int64_t>*,
                                 std::map<std::string, double>*>;

struct Field {
  std::string path;  // "train.steps"; top-level keys have no dot
  double min;        // inclusive bounds for numbers (and list elements)
  double max;
  std::vector<std::string> choices;  // allowed values for strings (and string lists); empty: any
  std::string help;
  FieldTarget (*target)(Recipe&);
};

const std::vector<Field>& recipe_schema();
const Field* find_field(const std::string& path);
// The sections that group fields ("model", "data", ...).
const std::vector<std::string>& recipe_sections();
// Keys allowed at the top level or under `section`, for "did you mean" suggestions.
std::vector<std::string> keys_under(const std::string& section);
// The closest candidate within a small edit distance, as " (did you mean 'x'?)", or "".
std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates);

// A value as text for --dry-run and messages: 3e-4, true, [0.9, 0.95], "cpu".
std::string value_text(const Field& field, Recipe& recipe);

}  // namespace dstrain::config
