#pragma once
// Typed assignment of a parsed Node into a schema field, with the checks every layer shares.
#include <string>

#include "dstrain/config/node.h"
#include "dstrain/config/schema.h"

namespace dstrain::config {

// Converts `node` to the field's type, checks range and choices, and stores it in `recipe`.
// `lax` adds pydantic's coercions that DeepSpeed configs rely on ("3" -> 3, "yes" -> true).
// Returns "" on success, else what is wrong (without the location).
std::string assign_node(const Field& field, const Node& node, Recipe& recipe, bool lax);

// The number in a scalar node, if it is one (or a numeric string when lax).
bool node_number(const Node& node, bool lax, double& out);
// The boolean in a scalar node, with pydantic's lax spellings when `lax`.
bool node_bool(const Node& node, bool lax, bool& out);

}  // namespace dstrain::config
