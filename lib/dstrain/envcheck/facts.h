#pragma once
// Facts about this node and this binary: the software stack and hardware that every rank of a
// job must agree on. Issue 10 gathers them from every rank and compares them.
#include <string>
#include <utility>
#include <vector>

namespace dstrain::envcheck {

// Ordered (name, value) pairs, e.g. {"torch", "2.11.0"}.
using Facts = std::vector<std::pair<std::string, std::string>>;

Facts collect_local_facts();

}  // namespace dstrain::envcheck
