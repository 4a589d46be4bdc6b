#pragma once
// The launcher side of `dstrain train` and `dstrain resume`: prepare the run directory, host the
// rendezvous store (node 0) or join it (other nodes), start and supervise the local workers.
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/launch/topology.h"

namespace dstrain::launch {

struct LaunchOptions {
  std::string executable;   // this binary, re-executed as `dstrain worker`
  bool resume = false;      // continue from the newest committed checkpoint
  std::string resume_from;  // train --resume PATH: a new run starting from this checkpoint
  launch::Topology topology;
  bool env_check = true;  // the workers' cross-rank preflight (--skip-env-check: false)
};

// This process's store secret (comm/store_auth.h), also exported for its workers: from the
// environment, or generated for a one-node launch; `warn` when there is none.
void use_store_secret(const Topology& topo, bool warn);

// Returns the launcher's exit status.
int launch_run(const config::Recipe& recipe, const LaunchOptions& options);

// Runs this process as one rank of a job started by torchrun, srun (one task per GPU), mpirun or
// PMI: rank 0 prepares the run directory; every rank then trains. Returns the exit status.
int run_as_rank(const config::Recipe& recipe, const LaunchOptions& options);

}  // namespace dstrain::launch
