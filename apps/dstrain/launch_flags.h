#pragma once
// The launch flags shared by `train`, `resume` and `bench comm`, and the topology they lead to.
#include <string>
#include <vector>

#include "dstrain/launch/topology.h"

namespace CLI {
class App;
}

namespace dstrain::app {

// Adds --nnodes, --node-rank, --master-addr, --master-port and --nproc-per-node to `cmd`.
void add_launch_flags(CLI::App& cmd, launch::LaunchFlags& flags);

// Decides the topology from flags, environment and the recipe's launch values.
launch::Topology decide_topology(const launch::LaunchFlags& flags, int recipe_nproc, bool recipe_nproc_given, int recipe_nnodes,
                                 const std::string& recipe_master_addr, int recipe_master_port);

// The --set overrides that make a recipe describe `topology` (world size, nodes, master).
std::vector<std::string> topology_overrides(const launch::Topology& topology);

}  // namespace dstrain::app
