#pragma once
// The recipe schema as data: one row per key. The YAML reader, the canonical JSON writer and
// reader, and the generated documentation all walk this one table.
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

using FieldTarget = std::variant<int64_t*, uint64_t*, double*, std::string*>;

struct Field {
  std::string path;  // "train.steps"; top-level keys have no dot
  double min;        // inclusive bounds for numbers
  double max;
  std::vector<std::string> choices;  // allowed values for strings; empty: any
  std::string help;
  FieldTarget (*target)(Recipe&);
};

const std::vector<Field>& recipe_schema();
// The sections that group fields ("model", "data", ...).
std::vector<std::string> recipe_sections();

}  // namespace dstrain::config
