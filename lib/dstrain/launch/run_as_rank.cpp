// This process as one rank of a job started by torchrun, srun (one task per GPU), mpirun or PMI.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include <unistd.h>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/failures.h"
#include "dstrain/launch/launch_run.h"
#include "dstrain/launch/preflight.h"
#include "dstrain/launch/tracker.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/run/run_lock.h"
#include "dstrain/train/startup_guard.h"
#include "dstrain/train/step_triggers.h"
#include "dstrain/train/worker.h"

namespace dstrain::launch {
namespace {

// A rank started on its own has no launcher to record its failure: it appends its own record to
// failures.jsonl (what the hints point to) and keeps its log lines in logs/rank_XXXXX.log.
void record_own_failure(const run::RunDir& run_dir, const Topology& topo, int exit_code, const std::string& what) {
  if (!std::filesystem::is_directory(run_dir.root())) return;  // failed before the run existed: the message is enough
  WorkerFailure f;
  f.happened = true;
  f.kind = FailureKind::kExit;
  f.rank = topo.rank;
  f.node = topo.node_rank;
  f.pid = static_cast<int>(::getpid());
  f.host = host_name();
  f.exit_code = exit_code;
  f.description = fmt::format("exited with status {}: {}", exit_code, what);
  f.unix_time = static_cast<double>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count()) /
                1000.0;
  append_failure(run_dir.root() + "/failures.jsonl", {f, topo.restart_count, last_logged_step(run_dir.metrics_path())});
}

int prepare_and_run(const config::Recipe& recipe, const LaunchOptions& options) {
  if (!options.resume) refuse_mismatched_init_weights(recipe);
  if (options.topology.rank == 0) refuse_unreadable_tasks(recipe);
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
  train::StepTriggers::install_signal_handlers();  // SIGTERM while waiting below must end this rank at once
  std::optional<train::StartupStopGuard> starting;
  starting.emplace(topo.rank, "startup (waiting for rank 0 to prepare the run directory)",
                   [&recipe] { return train::startup_stop_status(recipe.run_dir); });
  std::optional<run::RunDirLock> lock;  // rank 0 holds the run directory for the job's lifetime
  std::optional<Tracker> tracker;       // rank 0 hosts the wandb/mlflow side process (no launcher here)
  if (topo.rank == 0) {
    lock.emplace(recipe.run_dir);
    for (const auto& warning : recipe.warnings) log::warn(warning);
    if (options.resume && options.resume_from.empty())
      run_dir.check_resumable(recipe);
    else if (!restarted)
      run_dir.prepare_new(recipe);
    if (recipe.logging.has_tracker()) tracker.emplace(recipe, run_dir);  // before the mark: a missing SDK stops the job here
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
  starting.reset();  // run_worker guards its own startup
  if (std::filesystem::is_directory(run_dir.log_dir())) log::set_file(fmt::format("{}/rank_{:05d}.log", run_dir.log_dir(), topo.rank));
  const int requested_threads = static_cast<int>(recipe.launch.threads_per_worker);
  if (const ThreadCount count = worker_threads(requested_threads, 1, online_cores()); topo.rank == 0 && !count.warning.empty())
    log::warn(count.warning);
  run::WorkerEnv env = rank_env(topo, run_id, recipe.run_dir, rank_threads(requested_threads, topo, online_cores(), node_cores()));
  env.resume = resume;
  env.resume_from = options.resume_from;
  env.env_check = options.env_check;
  const int status = train::run_worker(env);
  if (tracker) tracker->finish();
  return status;
}

}  // namespace

int run_as_rank(const config::Recipe& recipe, const LaunchOptions& options) {
  const run::RunDir run_dir(recipe.run_dir);
  try {
    return prepare_and_run(recipe, options);
  } catch (const Error& e) {
    log::write_to_file(log::Level::kError, fmt::format("{}{}", e.what(), e.hint().empty() ? "" : " (hint: " + e.hint() + ")"));
    record_own_failure(run_dir, options.topology, exit_status_for(e.code()), first_line(e.what()));
    throw;
  } catch (const std::exception& e) {
    log::write_to_file(log::Level::kError, e.what());
    record_own_failure(run_dir, options.topology, exit_status::kInternal, first_line(e.what()));
    throw;
  }
}

}  // namespace dstrain::launch
