#include "launch_flags.h"

#include <CLI/CLI.hpp>

#include "dstrain_cuda.h"

namespace dstrain::app {

void add_launch_flags(CLI::App& cmd, launch::LaunchFlags& f) {
  cmd.add_option("--nproc-per-node", f.nproc_per_node, "Worker processes per node (default: launch.nproc_per_node, else the visible GPUs, else 1)")
      ->check(CLI::Range(1, 1024));
  cmd.add_option("--nnodes", f.nnodes, "Number of nodes; run one launcher per node with the same flags")->check(CLI::Range(1, 65536));
  cmd.add_option("--node-rank", f.node_rank, "This node's index, 0..nnodes-1 (node 0 hosts the rendezvous)")->check(CLI::Range(0, 65535));
  cmd.add_option("--master-addr", f.master_addr, "Address of node 0, where the rendezvous store runs");
  cmd.add_option("--master-port", f.master_port, "Port of the rendezvous store (0: a free one, single node only)")->check(CLI::Range(0, 65535));
}

launch::Topology decide_topology(const launch::LaunchFlags& flags, int recipe_nproc, bool recipe_nproc_given, int recipe_nnodes,
                                 const std::string& recipe_master_addr, int recipe_master_port) {
  return launch::detect_topology(flags, launch::current_environment(), recipe_nproc_given ? recipe_nproc : 0, recipe_nnodes, recipe_master_addr,
                                 recipe_master_port, dstrain_cuda_device_count());
}

std::vector<std::string> topology_overrides(const launch::Topology& t) {
  return {"launch.nproc_per_node=" + std::to_string(t.nproc_per_node), "launch.nnodes=" + std::to_string(t.nnodes),
          "launch.node_rank=" + std::to_string(t.node_rank), "launch.master_addr=" + t.master_addr,
          "launch.master_port=" + std::to_string(t.master_port)};
}

}  // namespace dstrain::app
