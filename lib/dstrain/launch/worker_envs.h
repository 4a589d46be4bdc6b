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

// The GPU of a rank that was started on its own (kRank) and sees `visible` GPUs: cuda:<local
// rank> when every local rank sees the node's GPUs (torchrun, srun --gpus-per-node), cuda:0 when
// it sees exactly one (srun --gpus-per-task=1 or a per-task CUDA_VISIBLE_DEVICES: its own GPU),
// cpu when it sees none.
std::string rank_device(int local_rank, int local_world_size, int visible);

// Intra-op threads of a rank started on its own: the recipe's value, else its cores divided
// among the node's ranks; under Slurm, a task bound to fewer cores than the node has (srun's
// --cpu-bind / --cpus-per-task) owns them, so they are not divided again.
int rank_threads(int requested, const Topology& topology, int cores_in_mask, int cores_on_node);

}  // namespace dstrain::launch
