#include "launch_flags.h"

#include <CLI/CLI.hpp>

namespace dstrain::app {

void add_launch_flags(CLI::App& cmd, launch::LaunchFlags& f) {
  cmd.add_option("--nproc-per-node,--nproc_per_node", f.nproc_per_node,
                 "Worker processes per node (default: launch.nproc_per_node, else the visible GPUs, else 1)")
      ->check(CLI::Range(1, 1024));
  cmd.add_option("--nnodes", f.nnodes, "Number of nodes; run one launcher per node with the same flags")->check(CLI::Range(1, 65536));
  cmd.add_option("--node-rank,--node_rank", f.node_rank, "This node's index, 0..nnodes-1 (node 0 hosts the rendezvous)")
      ->check(CLI::Range(0, 65535));
  cmd.add_option("--master-addr,--master_addr", f.master_addr, "Address of node 0, where the rendezvous store runs");
  cmd.add_option("--master-port,--master_port", f.master_port, "Port of the rendezvous store (0: a free one, single node only)")
      ->check(CLI::Range(0, 65535));
}

}  // namespace dstrain::app
