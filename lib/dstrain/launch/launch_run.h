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

// Returns the launcher's exit status.
int launch_run(const config::Recipe& recipe, const LaunchOptions& options);

// Runs this process as one rank of a job started by torchrun, srun (one task per GPU), mpirun or
// PMI: rank 0 prepares the run directory; every rank then trains. Returns the exit status.
int run_as_rank(const config::Recipe& recipe, const LaunchOptions& options);

}  // namespace dstrain::launch
