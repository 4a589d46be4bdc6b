#include "dstrain/launch/worker_envs.h"

#include <fmt/format.h>

#include "dstrain/core/threads.h"

#include "dstrain_cuda.h"

namespace dstrain::launch {
using run::WorkerEnv;

namespace {
// One GPU per local rank (NCCL cannot put two ranks of a group on one GPU): a local rank past the
// visible GPUs gets a device the worker refuses by name. No GPU visible: the CPU.
std::string device_for(int local_rank) { return dstrain_cuda_device_count() > 0 ? fmt::format("cuda:{}", local_rank) : "cpu"; }
}  // namespace

std::vector<run::WorkerEnv> local_worker_envs(const Topology& t, int master_port, const std::string& run_id, const std::string& run_dir,
                                              int threads) {
  std::vector<run::WorkerEnv> envs;
  for (int local = 0; local < t.nproc_per_node; ++local) {
    run::WorkerEnv env;
    env.rank = t.node_rank * t.nproc_per_node + local;
    env.local_rank = local;
    env.world_size = t.world();
    env.local_world_size = t.nproc_per_node;
    env.group_rank = t.node_rank;
    env.master_addr = t.master_addr;
    env.master_port = master_port;
    env.run_id = run_id;
    env.run_dir = run_dir;
    env.threads = threads;
    env.device = device_for(local);
    envs.push_back(env);
  }
  return envs;
}

run::WorkerEnv rank_env(const Topology& t, const std::string& run_id, const std::string& run_dir, int threads) {
  run::WorkerEnv env;
  env.rank = t.rank;
  env.local_rank = t.local_rank;
  env.world_size = t.world_size;
  env.local_world_size = t.local_world_size;
  env.group_rank = t.node_rank;
  env.master_addr = t.master_addr;
  env.master_port = t.master_port;
  env.run_id = run_id;
  env.run_dir = run_dir;
  env.threads = threads;
  env.host_store = t.host_store;
  env.publish_run_id = t.rank == 0;
  env.restart_count = t.restart_count;
  env.device = rank_device(t.local_rank, t.local_world_size, dstrain_cuda_device_count());
  return env;
}

std::string rank_device(int local_rank, int local_world_size, int visible) {
  if (visible <= 0) return "cpu";
  if (visible == 1 && local_world_size > 1) return "cuda:0";  // a GPU of its own, as --gpus-per-task=1 gives
  return fmt::format("cuda:{}", local_rank);                  // past the visible GPUs: refused by name when opened
}

int rank_threads(int requested, const Topology& t, int cores_in_mask, int cores_on_node) {
  const bool own_cores = t.source == "slurm" && cores_in_mask < cores_on_node;
  return threads_per_worker(requested, own_cores ? 1 : t.local_world_size, cores_in_mask);
}

}  // namespace dstrain::launch
