#pragma once
// The worker's environment contract, with torchrun's variable names, so that a worker started
// by torchrun, srun or mpirun behaves like one that dstrain started itself. The launcher builds
// them from its topology (launch/worker_envs.h); the worker reads them back.
#include <string>
#include <vector>

namespace dstrain::run {

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;  // node index
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string run_id;
  std::string run_dir;
  int restart_count = 0;
  int threads = 1;              // intra-op threads (DSTRAIN_THREADS, also OMP_NUM_THREADS)
  bool resume = false;          // DSTRAIN_RESUME=1: continue from run_dir/ckpt/latest
  std::string resume_from;      // DSTRAIN_RESUME_FROM: start from another run's checkpoint (train --resume PATH)
  bool host_store = false;      // this rank hosts the rendezvous store (no dstrain launcher)
  bool publish_run_id = false;  // no dstrain launcher: rank 0 publishes the run id (into torchrun's agent store too)
  std::string device = "cpu";   // DSTRAIN_DEVICE: "cpu", or "cuda:N" chosen by local rank
  bool env_check = true;        // DSTRAIN_ENV_CHECK=0 (--skip-env-check): no cross-rank preflight
  bool progress_line = false;   // DSTRAIN_PROGRESS=1: rank 0 prints run::ProgressLine for the launcher's bar
};

// The store's run key: the run id and the restart generation, so that a worker of another run
// or of an older restart is refused at join.
std::string store_run_key(const WorkerEnv& env);

// Reads the variables; throws Error{kEnvironment} naming a missing or malformed one.
WorkerEnv worker_env_from_environment();
// "NAME=value" strings for a child's environment.
std::vector<std::string> worker_env_assignments(const WorkerEnv& env);

}  // namespace dstrain::run
