#pragma once
// The launch flags shared by `train`, `resume`, `check-env` and `bench comm` (what they lead to is
// launch/plan.h's).
#include <string>
#include <vector>

#include "dstrain/launch/topology.h"

namespace CLI {
class App;
}

namespace dstrain::app {

// Adds --nnodes, --node-rank, --master-addr, --master-port and --nproc-per-node to `cmd`, with
// torchrun's spellings (--node_rank, --master_addr, --master_port, --nproc_per_node) as aliases.
void add_launch_flags(CLI::App& cmd, launch::LaunchFlags& flags);

}  // namespace dstrain::app
