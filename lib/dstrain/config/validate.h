#pragma once
// Cross-field checks of a recipe (single fields are range-checked by the schema).
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// Every problem found, as "key: what is wrong and what is allowed"; empty when valid.
std::vector<std::string> validate(const Recipe& recipe);

}  // namespace dstrain::config
