#pragma once
// What the training engine can run today. The config layer accepts everything DeepSpeed's
// semantics allow; this check refuses, before any worker starts, what the engine would otherwise
// silently do differently (no "auto" surprises). Each open issue shrinks the list.
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::train {

// One line per setting the engine cannot honour yet, naming the key, its source and the issue.
std::vector<std::string> unsupported_by_engine(const config::Recipe& recipe);

}  // namespace dstrain::train
