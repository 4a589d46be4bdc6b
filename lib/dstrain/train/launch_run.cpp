#include "dstrain/train/launch_run.h"

#include <ATen/Context.h>
#include <unistd.h>
#include <fmt/format.h>

#include <fstream>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/config/describe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/train/engine_support.h"
#include "dstrain/train/failures.h"
#include "dstrain/train/worker.h"
#include "dstrain/train/group_watch.h"
#include "dstrain/train/heartbeat.h"
#include "dstrain/train/run_dir.h"
#include "dstrain/train/training_device.h"
#include "dstrain_cuda.h"

namespace dstrain::train {
namespace fs = std::filesystem;
namespace {

std::string random_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

std::string describe_plan(const config::Recipe& r) {
  const int64_t world = r.world_size();
  return fmt::format(
      "run_dir {}\n  model: {} H={} layers={} heads={} vocab={} ({:.3f}M parameters)\n  data: {} ({} format, seq_len {})\n"
      "  batch: global {} = micro {} x {} ranks x {} accumulation{}; {} tokens/step; {} steps\n"
      "  optimizer: {} lr {:g}; schedule {} ({} warmup steps); {}, ZeRO stage {}",
      r.run_dir, config::name(r.model.family), r.model.hidden_size, r.model.num_layers, r.model.num_heads, r.model.vocab_size,
      static_cast<double>(config::parameter_counts(r.model).total) / 1e6, r.data.path, config::name(r.data.format), r.data.seq_len, config::global_batch_at(r, 0),
      r.train.micro_batch_size, world, config::accumulation_at(r, 0), r.train.accumulation.empty() ? "" : " (first stage)",
      config::global_batch_at(r, 0) * r.data.seq_len, r.train.steps, config::name(r.optimizer.type), r.optimizer.lr, config::name(r.schedule.type), r.schedule.warmup_steps,
      config::name(r.precision.dtype), r.zero.stage);
}

namespace {

void refuse_unsupported(const config::Recipe& recipe) {
  if (const auto missing = unsupported_by_engine(recipe); !missing.empty())
    throw Error(ErrorCode::kConfig,
                fmt::format("the configuration is valid, but the training engine cannot run {} of its settings yet:\n  {}",
                            missing.size() == 1 ? "one" : std::to_string(missing.size()), fmt::join(missing, "\n  ")),
                "change these settings, or check the plan without training with --dry-run");
}

// Model state alone (parameters, gradients, master weights, Adam states: the ZeRO formulas) must
// fit in this node's memory: without a GPU all of it lives in host RAM. A run that cannot fit is
// refused before any worker starts, instead of dying in the kernel's OOM killer minutes later.
void refuse_if_host_memory_short(const config::Recipe& recipe, int local_workers) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double available_kib = -1, value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit)
    if (key == "MemAvailable:") available_kib = value;
  if (available_kib <= 0) return;
  const config::ModelStateMemory per_rank = config::model_state_memory(recipe);
  const bool on_gpu = at::hasCUDA();
  const double needed = local_workers * (per_rank.host_bytes + (on_gpu ? 0.0 : per_rank.device_bytes));
  const double available = available_kib * 1024.0;
  if (needed > available)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("the model state needs {:.1f} GiB of host memory on this node ({} workers x {:.1f} GiB: parameters, gradients and "
                            "optimizer states at ZeRO stage {}, {}), but only {:.1f} GiB is available",
                            needed / 1073741824.0, local_workers, needed / local_workers / 1073741824.0, recipe.zero.stage, config::name(recipe.precision.dtype),
                            available / 1073741824.0),
                "spread the run over more nodes, raise zero.stage, or train a smaller model; `dstrain train --dry-run` shows the estimate");
}

// On GPUs, the model state per rank (the ZeRO formulas) must fit in each GPU this node's ranks
// use: refused before any worker starts, with what to change, instead of a CUDA OOM later.
void refuse_if_gpu_memory_short(const config::Recipe& recipe, int local_workers) {
  const int gpus = dstrain_cuda_device_count();
  const double needed = config::model_state_memory(recipe).device_bytes;
  for (int g = 0; g < std::min(gpus, local_workers); ++g) {
    int major = 0, minor = 0;
    size_t total = 0;
    if (dstrain_cuda_device_props(g, &major, &minor, &total) != 0 || total == 0) continue;
    if (needed > static_cast<double>(total))
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("the model state alone needs {:.1f} GiB per rank (parameters, gradients and optimizer states at ZeRO stage {}, {}), "
                              "more than GPU {}'s {:.1f} GiB, before any activations",
                              needed / 1073741824.0, recipe.zero.stage, config::name(recipe.precision.dtype), g, static_cast<double>(total) / 1073741824.0),
                  train::out_of_memory_hint(recipe));
  }
}

// Node 0 prepares the run directory; a resume needs a committed checkpoint.
void prepare_run_dir(const config::Recipe& recipe, const RunDir& run_dir, bool resume) {
  if (resume) {
    // Existence only: the workers' rank 0 verifies and, if it must, falls back to an older one.
    if (!ckpt::has_committed_checkpoint(run_dir.ckpt_dir(recipe)))
      throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint to resume from", recipe.run_dir),
                  "start it with `dstrain train` instead");
  } else {
    run_dir.prepare_new(recipe);
  }
}

// Node > 0 after a restart decision: node 0's store comes back with the next generation's key.
std::string await_generation(const launch::Topology& topo, int generation, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string suffix = "/" + std::to_string(generation);
  for (;;) {
    try {
      const auto info = comm::fetch_from_node_zero(topo.master_addr, topo.master_port, "config", std::chrono::seconds(5));
      if (info.run_key.size() > suffix.size() && info.run_key.compare(info.run_key.size() - suffix.size(), suffix.size(), suffix) == 0) return info.run_key;
    } catch (const Error&) {
      // node 0's store is being replaced
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(ErrorCode::kComm, fmt::format("node 0 at {}:{} did not start restart generation {} within {} s", topo.master_addr, topo.master_port,
                                                generation, std::chrono::duration_cast<std::chrono::seconds>(timeout).count()),
                  "check node 0's log; continue with `dstrain resume` on every node");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

int launch_run(const config::Recipe& recipe, const LaunchOptions& options) {
  refuse_unsupported(recipe);
  for (const auto& warning : recipe.warnings) log::warn(warning);
  const auto& topo = options.topology;
  refuse_if_host_memory_short(recipe, topo.nproc_per_node);
  refuse_if_gpu_memory_short(recipe, topo.nproc_per_node);
  const int nproc = topo.nproc_per_node;
  const RunDir run_dir(recipe.run_dir);
  const auto timeout = std::chrono::milliseconds(recipe.launch.timeout_s * 1000);

  // Node 0 hosts the store and publishes the run id and the resolved config; the other nodes'
  // launchers fetch both, so the nodes need not share a filesystem.
  std::unique_ptr<comm::StoreServer> store;
  std::string run_key;
  int port = topo.master_port;
  if (topo.node_rank == 0) {
    prepare_run_dir(recipe, run_dir, options.resume && options.resume_from.empty());
    const int generation = 0;
    run_key = random_run_id() + "/" + std::to_string(generation);
    store = std::make_unique<comm::StoreServer>(topo.master_addr, topo.master_port, run_key, timeout);
    store->publish("config", read_file(run_dir.config_path()));
    port = store->port();
  } else {
    log::info(fmt::format("node {} of {}: joining node 0's launcher at {}:{}", topo.node_rank, topo.nnodes, topo.master_addr, topo.master_port));
    const auto info = comm::fetch_from_node_zero(topo.master_addr, topo.master_port, "config", timeout);
    run_key = info.run_key;
    std::filesystem::create_directories(run_dir.log_dir());
    if (std::filesystem::exists(run_dir.config_path()) && read_file(run_dir.config_path()) != info.value && !(options.resume && options.resume_from.empty()))
      throw Error(ErrorCode::kUsage, fmt::format("run_dir '{}' on node {} already holds another run", recipe.run_dir, topo.node_rank),
                  "use a run_dir that is new on every node, or resume the run it holds");
    if (!std::filesystem::exists(run_dir.config_path()) || read_file(run_dir.config_path()) != info.value) write_file_atomic(run_dir.config_path(), info.value);
  }
  const std::string run_id = run_key.substr(0, run_key.rfind('/'));
  const int threads = threads_per_worker(static_cast<int>(recipe.launch.threads_per_worker), nproc, online_cores());
  log::info(fmt::format("dstrain {} run {}: node {} of {}, {} worker{} x {} thread{}, rendezvous at {}:{}", options.resume ? "resuming" : "starting",
                        run_id, topo.node_rank, topo.nnodes, nproc, nproc == 1 ? "" : "s", threads, threads == 1 ? "" : "s", topo.master_addr, port));
  if (topo.node_rank == 0) log::info(describe_plan(recipe));

  launch::SupervisorOptions sup;
  sup.executable = options.executable;
  sup.worker_args = {"worker"};
  sup.log_dir = run_dir.log_dir();
  sup.grace_period_s = static_cast<int>(recipe.launch.stop_grace_s);
  sup.progress_bar = ::isatty(STDERR_FILENO) == 1 && std::getenv("TERM") && std::string(std::getenv("TERM")) != "dumb";
  sup.watch_period_ms = static_cast<int>(heartbeat_period(static_cast<double>(recipe.launch.heartbeat_timeout_s)).count());
  GroupWatchOptions watch_options;
  watch_options.node_rank = topo.node_rank;
  watch_options.nnodes = topo.nnodes;
  watch_options.world_size = topo.world();
  watch_options.master = fmt::format("{}:{}", topo.master_addr, port);
  watch_options.heartbeat_timeout_s = static_cast<double>(recipe.launch.heartbeat_timeout_s);
  watch_options.collective_timeout_s = static_cast<double>(recipe.launch.collective_timeout_s);
  const auto hb_timeout = std::chrono::milliseconds(recipe.launch.heartbeat_timeout_s * 1000);
  // Each generation is a whole group, on every node: on a failure all workers stop, node 0
  // records it and decides; with launch.max_restarts, a new generation with a fresh store
  // resumes from the latest committed checkpoint after a backoff, and the other nodes rejoin it.
  bool resume = options.resume;
  std::string resume_from = options.resume_from;
  std::vector<FailureRecord> failures;
  int status = 0;
  for (int generation = 0;; ++generation) {
    if (generation > 0 && topo.node_rank == 0) {  // nothing of the failed generation's rendezvous survives
      store.reset();
      run_key = run_id + "/" + std::to_string(generation);
      store = std::make_unique<comm::StoreServer>(topo.master_addr, topo.master_port, run_key, timeout);
      store->publish("config", read_file(run_dir.config_path()));
      port = store->port();
    } else if (generation > 0) {  // wait for node 0's next generation
      run_key = await_generation(topo, generation, timeout + std::chrono::seconds(60));
    }
    watch_options.store_run_key = run_key;
    GroupWatch watch(topo.node_rank == 0 ? std::make_unique<comm::StoreClient>(store->client())
                                         : std::make_unique<comm::StoreClient>(topo.master_addr, topo.master_port, hb_timeout),
                     watch_options);
    sup.watchdog = [&watch] { return watch.poll(); };
    sup.workers = launch::local_worker_envs(topo, port, run_id, recipe.run_dir, threads);
    for (auto& env : sup.workers) env.resume = resume, env.resume_from = resume_from, env.restart_count = generation, env.env_check = options.env_check;
    launch::WorkerFailure failure;
    status = launch::supervise(sup, &failure);
    if (!failure.happened) break;
    if (const std::string where = watch.positions(); !where.empty() && failure.kind != launch::FailureKind::kHang) log::warn("where each rank was: " + where);
    if (topo.node_rank > 0) {
      // Node 0 decides for the group; this node reports its own failure and follows.
      if (failure.kind != launch::FailureKind::kRemote && failure.kind != launch::FailureKind::kNodeLost) watch.report_failure(failure);
      if (failure.kind == launch::FailureKind::kNodeLost) break;
      const std::optional<Decision> decision = watch.await_decision();
      if (!decision) {
        log::error(fmt::format("node 0 at {} did not say how to go on within {} s; stopping", watch_options.master, recipe.launch.heartbeat_timeout_s));
        break;
      }
      if (!decision->restart) break;
      resume = decision->resume, resume_from.clear();
      log::warn(fmt::format("node 0 restarts the group (generation {}); rejoining", generation + 1));
      continue;
    }
    // Every node's failures of this generation, in time order: the first is the root cause.
    std::vector<launch::WorkerFailure> seen{failure};
    if (failure.kind != launch::FailureKind::kRemote && topo.nnodes > 1)
      for (auto& remote : watch.gather_reports(std::min(5.0, watch_options.heartbeat_timeout_s))) {
        log::warn("also failed: " + describe_failure(remote));
        seen.push_back(std::move(remote));
      }
    std::sort(seen.begin(), seen.end(), [](const auto& x, const auto& y) { return x.unix_time < y.unix_time; });
    const int64_t step_reached = last_logged_step(run_dir.metrics_path());
    for (const auto& f : seen) {
      failures.push_back({f, generation, step_reached});
      append_failure(run_dir.root() + "/failures.jsonl", failures.back());
    }
    failure = seen.front();
    bool again = generation < recipe.launch.max_restarts && restartable(failure);
    if (const std::vector<int> lost = topo.nnodes > 1 ? watch.lost_nodes() : std::vector<int>{}; !lost.empty()) {
      log::error(fmt::format("node{} {} lost: the group cannot be formed again; continue on the remaining nodes with `dstrain resume {}` (any world size "
                             "that divides the global batch)",
                             lost.size() == 1 ? "" : "s", fmt::join(lost, ", "), run_dir.root()));
      again = false;
    }
    Decision decision;
    decision.restart = again;
    if (again && ckpt::has_committed_checkpoint(run_dir.ckpt_dir(recipe))) resume = true, resume_from.clear();
    decision.resume = resume && resume_from.empty();
    decision.reason = describe_failure(failure);
    watch.decide(decision);
    if (!again) break;
    const int wait = restart_backoff_s(generation + 1);
    log::warn(fmt::format("restart {} of {} in {} s, from {}", generation + 1, recipe.launch.max_restarts, wait,
                          !resume ? "the start" : resume_from.empty() ? "the latest committed checkpoint" : resume_from));
    std::this_thread::sleep_for(std::chrono::seconds(wait));
  }
  if (!failures.empty() && topo.node_rank == 0) log::warn(root_cause_report(failures));
  if (status == 0 && topo.node_rank == 0)
    log::info(fmt::format("run finished; metrics in {}, checkpoints in {}", run_dir.metrics_path(), run_dir.ckpt_dir(recipe)));
  return status;
}

int run_as_rank(const config::Recipe& recipe, const LaunchOptions& options) {
  refuse_unsupported(recipe);
  const auto& topo = options.topology;
  const RunDir run_dir(recipe.run_dir);
  const auto timeout = std::chrono::milliseconds(recipe.launch.timeout_s * 1000);
  const std::string run_id = topo.shared_run_id();
  // Rank 0 prepares the run directory and marks it with the run id; the others wait for the mark
  // (the run directory is on a filesystem that every node sees, as torchrun and srun jobs assume).
  const std::string mark = recipe.run_dir + "/.run_id";
  if (topo.rank == 0) {
    for (const auto& warning : recipe.warnings) log::warn(warning);
    prepare_run_dir(recipe, run_dir, options.resume && options.resume_from.empty());
    write_file_atomic(mark, run_id);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(mark) || read_file(mark) != run_id) {
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(ErrorCode::kComm, fmt::format("rank {}: rank 0 did not prepare {} for run {} within {} s", topo.rank, recipe.run_dir, run_id,
                                                  recipe.launch.timeout_s),
                    "check rank 0's output; the run directory must be on a filesystem that every node sees");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  launch::WorkerEnv env =
      launch::rank_env(topo, run_id, recipe.run_dir, threads_per_worker(static_cast<int>(recipe.launch.threads_per_worker), topo.local_world_size, online_cores()));
  env.resume = options.resume;
  env.resume_from = options.resume_from;
  env.env_check = options.env_check;
  return run_worker(env);
}

}  // namespace dstrain::train
