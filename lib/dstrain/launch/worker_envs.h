#pragma once
// The workers' environments (run/worker_env.h) for a topology: this node's local workers, or this
// process as one rank of a torchrun/srun/mpirun job.
#include <string>
#include <vector>

#include "dstrain/launch/topology.h"
#include "dstrain/run/worker_env.h"

namespace dstrain::launch {

// The environments of this node's workers (kLauncher topology): global ranks, the device by
// local rank (cuda:N when GPUs are visible, else cpu), the run's id and directory.
std::vector<run::WorkerEnv> local_worker_envs(const Topology& topology, int master_port, const std::string& run_id,
                                              const std::string& run_dir, int threads);
// The environment of this process as one rank of a kRank topology (torchrun, srun, mpirun).
run::WorkerEnv rank_env(const Topology& topology, const std::string& run_id, const std::string& run_dir, int threads);

}  // namespace dstrain::launch
