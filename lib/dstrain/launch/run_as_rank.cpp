// This process as one rank of a job started by torchrun, srun (one task per GPU), mpirun or PMI.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/launch_run.h"
#include "dstrain/launch/preflight.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/run/run_lock.h"
#include "dstrain/train/worker.h"

namespace dstrain::launch {

int run_as_rank(const config::Recipe& recipe, const LaunchOptions& options) {
  refuse_unsupported(recipe);
  use_store_secret(options.topology, options.topology.rank == 0 && options.topology.nnodes > 1);
  const auto& topo = options.topology;
  const run::RunDir run_dir(recipe.run_dir);
  const auto timeout = std::chrono::milliseconds(recipe.launch.timeout_s * 1000);
  const std::string run_id = topo.shared_run_id();
  // torchrun restarted the group (--max-restarts): this run goes on, from its latest checkpoint
  // when it has one, else from the start in the same directory.
  const bool restarted = topo.restart_count > 0 && !options.resume && std::filesystem::exists(run_dir.config_path()) &&
                         config::config_hash(config::read_resolved_config(run_dir.config_path())) == config::config_hash(recipe);
  const bool resume = options.resume || (restarted && ckpt::has_committed_checkpoint(run_dir.ckpt_dir(recipe)));
  if (restarted && topo.rank == 0)
    log::warn(fmt::format("torchrun restart {}: continuing {} from {}", topo.restart_count, recipe.run_dir,
                          resume ? "its latest committed checkpoint" : "the start (no checkpoint yet)"));
  // Rank 0 prepares the run directory and marks it with the run id; the others wait for the mark
  // (the run directory is on a filesystem that every node sees, as torchrun and srun jobs assume).
  const std::string mark = recipe.run_dir + "/.run_id";
  std::optional<run::RunDirLock> lock;  // rank 0 holds the run directory for the job's lifetime
  if (topo.rank == 0) {
    lock.emplace(recipe.run_dir);
    for (const auto& warning : recipe.warnings) log::warn(warning);
    if (options.resume && options.resume_from.empty())
      run_dir.check_resumable(recipe);
    else if (!restarted)
      run_dir.prepare_new(recipe);
    write_file_atomic(mark, run_id);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(mark) || read_file(mark) != run_id) {
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(ErrorCode::kComm,
                    fmt::format("rank {}: rank 0 did not prepare {} for run {} within {} s", topo.rank, recipe.run_dir, run_id,
                                recipe.launch.timeout_s),
                    "check rank 0's output; the run directory must be on a filesystem that every node sees");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  run::WorkerEnv env =
      rank_env(topo, run_id, recipe.run_dir,
               threads_per_worker(static_cast<int>(recipe.launch.threads_per_worker), topo.local_world_size, online_cores()));
  env.resume = resume;
  env.resume_from = options.resume_from;
  env.env_check = options.env_check;
  return train::run_worker(env);
}

}  // namespace dstrain::launch
