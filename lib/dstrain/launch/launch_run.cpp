#include "dstrain/launch/launch_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/store_auth.h"
#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/failures.h"
#include "dstrain/run/run_lock.h"
#include "dstrain/launch/group_watch.h"
#include "dstrain/launch/plan.h"
#include "dstrain/launch/preflight.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/launch/tracker.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/run/store_keys.h"

namespace dstrain::launch {
namespace {

std::string random_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

// Node > 0 after a restart decision: node 0's store comes back with the next generation's key.
std::string await_generation(const launch::Topology& topo, int generation, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string suffix = "/" + std::to_string(generation);
  for (;;) {
    try {
      const auto info = comm::fetch_from_node_zero(topo.master_addr, topo.master_port, "config", std::chrono::seconds(5));
      if (info.run_key.size() > suffix.size() && info.run_key.compare(info.run_key.size() - suffix.size(), suffix.size(), suffix) == 0)
        return info.run_key;
    } catch (const Error&) {
      // node 0's store is being replaced
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(ErrorCode::kComm,
                  fmt::format("node 0 at {}:{} did not start restart generation {} within {} s", topo.master_addr, topo.master_port,
                              generation, std::chrono::duration_cast<std::chrono::seconds>(timeout).count()),
                  "check node 0's log; continue with `dstrain resume` on every node");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// One node's launcher across restart generations. Each generation is a whole group on every
// node: on a failure all workers stop, node 0 records it and decides; with launch.max_restarts, a
// new generation with a fresh store resumes from the latest committed checkpoint after a
// backoff, and the other nodes' launchers rejoin it.
class Launcher {
 public:
  Launcher(const config::Recipe& recipe, const LaunchOptions& options)
      : recipe_(recipe), options_(options), topo_(options.topology), run_dir_(recipe.run_dir), timeout_(recipe.launch.timeout_s * 1000),
        resume_(options.resume), resume_from_(options.resume_from) {}
  int run();

 private:
  void open_rendezvous();
  void host_generation(int generation);
  SupervisorOptions supervisor_options() const;
  GroupWatchOptions watch_options() const;
  bool restart_after(const WorkerFailure& failure, GroupWatch& watch, int generation);
  bool follow_node_zero(const WorkerFailure& failure, GroupWatch& watch, int generation);
  bool decide_on_node_zero(WorkerFailure failure, GroupWatch& watch, int generation);

  const config::Recipe& recipe_;
  const LaunchOptions& options_;
  const Topology& topo_;
  const run::RunDir run_dir_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<comm::StoreServer> store_;  // node 0
  std::string run_key_, run_id_;              // run_id_/generation
  int port_ = 0;
  bool resume_;
  std::string resume_from_;
  std::vector<FailureRecord> failures_;
  int stopped_by_ = 0;  // SIGINT/SIGTERM during a restart backoff
};

// Node 0 hosts the store and publishes the run id and the resolved config; the other nodes'
// launchers fetch both, so the nodes need not share a filesystem.
void Launcher::open_rendezvous() {
  port_ = topo_.master_port;
  if (topo_.node_rank == 0) {
    if (options_.resume && options_.resume_from.empty())
      run_dir_.check_resumable(recipe_);
    else
      run_dir_.prepare_new(recipe_);
    run_id_ = random_run_id();
    host_generation(0);
    return;
  }
  log::info(fmt::format("node {} of {}: joining node 0's launcher at {}:{}", topo_.node_rank, topo_.nnodes, topo_.master_addr,
                        topo_.master_port));
  const auto info = comm::fetch_from_node_zero(topo_.master_addr, topo_.master_port, "config", timeout_);
  run_key_ = info.run_key;
  run_id_ = run_key_.substr(0, run_key_.rfind('/'));
  std::filesystem::create_directories(run_dir_.log_dir());
  const bool same = std::filesystem::exists(run_dir_.config_path()) && read_file(run_dir_.config_path()) == info.value;
  // Another run here: refused if it has a committed checkpoint, set aside if it never saved (as
  // node 0 does with its own directory).
  if (!same && !(options_.resume && options_.resume_from.empty())) run_dir_.set_aside_unsaved_run(recipe_);
  if (!same) {
    std::filesystem::create_directories(run_dir_.log_dir());
    write_file_atomic(run_dir_.config_path(), info.value);
  }
}

// Node 0: a fresh store for `generation` (nothing of a failed generation's rendezvous survives).
void Launcher::host_generation(int generation) {
  store_.reset();
  run_key_ = run_id_ + "/" + std::to_string(generation);
  store_ = std::make_unique<comm::StoreServer>(topo_.master_addr, topo_.master_port, run_key_, timeout_);
  store_->publish("config", read_file(run_dir_.config_path()));
  port_ = store_->port();
}

SupervisorOptions Launcher::supervisor_options() const {
  SupervisorOptions sup;
  sup.executable = options_.executable;
  sup.worker_args = {"worker"};
  sup.log_dir = run_dir_.log_dir();
  sup.grace_period_s = static_cast<int>(recipe_.launch.stop_grace_s);
  const char* term = std::getenv("TERM");
  sup.progress_bar = ::isatty(STDERR_FILENO) == 1 && term && std::string(term) != "dumb";
  sup.watch_period_ms = static_cast<int>(run::heartbeat_period(static_cast<double>(recipe_.launch.heartbeat_timeout_s)).count());
  return sup;
}

GroupWatchOptions Launcher::watch_options() const {
  GroupWatchOptions w;
  w.store_run_key = run_key_;
  w.node_rank = topo_.node_rank;
  w.nnodes = topo_.nnodes;
  w.world_size = topo_.world();
  w.master = fmt::format("{}:{}", topo_.master_addr, port_);
  w.heartbeat_timeout_s = static_cast<double>(recipe_.launch.heartbeat_timeout_s);
  w.collective_timeout_s = static_cast<double>(recipe_.launch.collective_timeout_s);
  return w;
}

int Launcher::run() {
  const SignalScope signals;  // for the whole launch: restart backoffs included
  open_rendezvous();
  const int nproc = topo_.nproc_per_node;
  const ThreadCount count = worker_threads(static_cast<int>(recipe_.launch.threads_per_worker), nproc, online_cores());
  const int threads = count.threads;
  if (!count.warning.empty()) log::warn(count.warning);
  log::info(fmt::format("dstrain {} run {}: node {} of {}, {} worker{} x {} thread{} ({}), rendezvous at {}:{}",
                        options_.resume ? "resuming" : "starting", run_id_, topo_.node_rank, topo_.nnodes, nproc, nproc == 1 ? "" : "s",
                        threads, threads == 1 ? "" : "s", count.why, topo_.master_addr, port_));
  if (topo_.node_rank == 0) log::info(describe_plan(recipe_));
  std::optional<Tracker> tracker;  // W&B / MLflow: started before any worker, so that a missing SDK stops nothing
  if (topo_.node_rank == 0 && recipe_.logging.has_tracker()) tracker.emplace(recipe_, run_dir_);
  SupervisorOptions sup = supervisor_options();
  int status = 0;
  for (int generation = 0;; ++generation) {
    if (generation > 0 && topo_.node_rank == 0)
      host_generation(generation);
    else if (generation > 0)
      run_key_ = await_generation(topo_, generation, timeout_ + std::chrono::seconds(60));
    sup.workers = local_worker_envs(topo_, port_, run_id_, recipe_.run_dir, threads);
    GroupWatchOptions watching = watch_options();
    for (const auto& env : sup.workers) watching.local_ranks.push_back(env.rank);
    GroupWatch watch(
        [this] {
          return topo_.node_rank == 0
                     ? std::make_unique<comm::StoreClient>(store_->client())
                     : std::make_unique<comm::StoreClient>(topo_.master_addr, topo_.master_port,
                                                           std::chrono::milliseconds(recipe_.launch.heartbeat_timeout_s * 1000));
        },
        watching);
    sup.watchdog = [&watch] { return watch.poll(); };
    for (auto& env : sup.workers)
      env.resume = resume_, env.resume_from = resume_from_, env.restart_count = generation, env.env_check = options_.env_check;
    WorkerFailure failure;
    status = supervise(sup, &failure);
    if (!failure.happened || !restart_after(failure, watch, generation)) break;
  }
  if (tracker) tracker->finish();
  if (!failures_.empty() && topo_.node_rank == 0) log::warn(root_cause_report(failures_));
  if (status != 0 && !failures_.empty() && topo_.node_rank == 0 && !stopped_by_)
    log::warn(ckpt::has_committed_checkpoint(run_dir_.ckpt_dir(recipe_))
                  ? fmt::format("continue from the newest checkpoint with `dstrain resume {}` (launch.max_restarts / --max-restarts N "
                                "restarts by itself)",
                                run_dir_.root())
                  : fmt::format("the run stopped before its first checkpoint: `dstrain resume {}` starts it again", run_dir_.root()));
  if (stopped_by_) {
    const bool resumable = ckpt::has_committed_checkpoint(run_dir_.ckpt_dir(recipe_));
    log::warn(fmt::format("stopped by {} during the restart backoff; {}", stopped_by_ == SIGINT ? "SIGINT" : "SIGTERM",
                          resumable ? fmt::format("continue with `dstrain resume {}`", run_dir_.root()) : "no checkpoint to resume from"));
    return resumable ? exit_status::kStopped : exit_status::kInterrupted;
  }
  if (status == 0 && topo_.node_rank == 0)
    log::info(fmt::format("run finished; metrics in {}, checkpoints in {}", run_dir_.metrics_path(), run_dir_.ckpt_dir(recipe_)));
  return status;
}

bool Launcher::restart_after(const WorkerFailure& failure, GroupWatch& watch, int generation) {
  if (const std::string where = watch.positions(); !where.empty() && failure.kind != FailureKind::kHang)
    log::warn("where each rank was: " + where);
  return topo_.node_rank > 0 ? follow_node_zero(failure, watch, generation) : decide_on_node_zero(failure, watch, generation);
}

// Node > 0: node 0 decides for the group; this node reports its own failure and follows.
bool Launcher::follow_node_zero(const WorkerFailure& failure, GroupWatch& watch, int generation) {
  if (failure.kind != FailureKind::kRemote && failure.kind != FailureKind::kNodeLost) watch.report_failure(failure);
  if (failure.kind == FailureKind::kNodeLost) return false;
  const std::optional<Decision> decision = watch.await_decision();
  if (!decision) {
    log::error(fmt::format("node 0 at {}:{} did not say how to go on within {} s; stopping", topo_.master_addr, port_,
                           recipe_.launch.heartbeat_timeout_s));
    return false;
  }
  if (!decision->restart) return false;
  resume_ = decision->resume, resume_from_.clear();
  log::warn(fmt::format("node 0 restarts the group (generation {}); rejoining", generation + 1));
  return true;
}

// Node 0: every node's failures of this generation in time order (the first is the root cause)
// into failures.jsonl; then restart, or not, and tell every node.
bool Launcher::decide_on_node_zero(WorkerFailure failure, GroupWatch& watch, int generation) {
  std::vector<WorkerFailure> seen{failure};
  if (failure.kind != FailureKind::kRemote && topo_.nnodes > 1)
    for (auto& remote : watch.gather_reports(std::min(5.0, static_cast<double>(recipe_.launch.heartbeat_timeout_s)))) {
      log::warn("also failed: " + describe_failure(remote));
      seen.push_back(std::move(remote));
    }
  std::sort(seen.begin(), seen.end(), [](const auto& x, const auto& y) { return x.unix_time < y.unix_time; });
  const int64_t step_reached = last_logged_step(run_dir_.metrics_path());
  for (const auto& f : seen) {
    failures_.push_back({f, generation, step_reached});
    append_failure(run_dir_.root() + "/failures.jsonl", failures_.back());
  }
  failure = seen.front();
  bool again = generation < recipe_.launch.max_restarts && restartable(failure);
  if (const std::vector<int> lost = topo_.nnodes > 1 ? watch.lost_nodes() : std::vector<int>{}; !lost.empty()) {
    log::error(fmt::format(
        "node{} {} lost: the group cannot be formed again; continue on the remaining nodes with `dstrain resume {}` (any world size "
        "that divides the global batch)",
        lost.size() == 1 ? "" : "s", fmt::join(lost, ", "), run_dir_.root()));
    again = false;
  }
  if (again && ckpt::has_committed_checkpoint(run_dir_.ckpt_dir(recipe_))) resume_ = true, resume_from_.clear();
  watch.decide({again, resume_ && resume_from_.empty(), describe_failure(failure)});
  if (!again) return false;
  const int wait = restart_backoff_s(generation + 1);
  log::warn(fmt::format("restart {} of {} in {} s, from {}", generation + 1, recipe_.launch.max_restarts, wait,
                        !resume_               ? "the start"
                        : resume_from_.empty() ? "the latest committed checkpoint"
                                               : resume_from_));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(wait);
  while (std::chrono::steady_clock::now() < until) {
    if ((stopped_by_ = SignalScope::stop_signal()) != 0) return false;  // no new generation; run() reports
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace

void use_store_secret(const Topology& topo, bool warn) {
  const std::string secret = comm::store_secret_from_environment(topo.nnodes == 1 && topo.mode == Topology::Mode::kLauncher);
  if (secret.empty() && warn)
    log::warn(
        fmt::format("the rendezvous store's control values (heartbeats, decisions, the config) are not authenticated: give every "
                    "node's launcher the same secret in {} or {} (README: threat model)",
                    comm::kSecretVariable, comm::kSecretFileVariable));
  comm::set_store_secret(secret);
  if (!secret.empty()) ::setenv(comm::kSecretVariable, secret.c_str(), 1);  // the workers' copy, through their environment
}

namespace {

// Started by a Slurm batch script without srun or exec: signals meant for the job (scancel,
// --signal=B:TERM@N) reach the script's shell, which does not pass them on, and when the shell
// ends dstrain would train on outside its job (issue 25). So the launcher asks the kernel for a
// SIGTERM when its parent dies: it then stops at a step boundary with a checkpoint (exit 75).
void follow_batch_shell() {
  if (!std::getenv("SLURM_JOB_ID") || std::getenv("SLURM_STEP_ID")) return;  // not in a batch script
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) return;
  if (::getppid() == 1) std::raise(SIGTERM);  // the shell is already gone
  log::info(
      "started from a Slurm batch script: stopping with a checkpoint if the script's shell ends; use `exec dstrain ...` or "
      "`srun dstrain ...` so that scancel and --signal reach dstrain directly");
}

}  // namespace

int launch_run(const config::Recipe& recipe, const LaunchOptions& options) {
  follow_batch_shell();
  use_store_secret(options.topology, options.topology.nnodes > 1);
  if (!options.resume) refuse_mismatched_init_weights(recipe);
  refuse_unreadable_tasks(recipe);
  for (const auto& warning : recipe.warnings) log::warn(warning);
  refuse_if_memory_short(recipe, options.topology.nproc_per_node);
  const run::RunDirLock lock(recipe.run_dir, options.topology.node_rank);  // one launcher per run_dir and node
  return Launcher(recipe, options).run();
}

}  // namespace dstrain::launch
