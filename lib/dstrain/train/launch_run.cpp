#include "dstrain/train/launch_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/config/describe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/train/engine_support.h"
#include "dstrain/train/run_dir.h"

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
      r.run_dir, r.model.family, r.model.hidden_size, r.model.num_layers, r.model.num_heads, r.model.vocab_size,
      static_cast<double>(config::dense_parameter_count(r.model)) / 1e6, r.data.path, r.data.format, r.data.seq_len, config::global_batch_at(r, 0),
      r.train.micro_batch_size, world, config::accumulation_at(r, 0), r.train.accumulation.empty() ? "" : " (first stage)",
      config::global_batch_at(r, 0) * r.data.seq_len, r.train.steps, r.optimizer.type, r.optimizer.lr, r.schedule.type, r.schedule.warmup_steps,
      r.precision.dtype, r.zero.stage);
}

int launch_run(const config::Recipe& recipe, const LaunchOptions& options) {
  const int world = static_cast<int>(recipe.launch.nproc_per_node);
  if (const auto missing = unsupported_by_engine(recipe); !missing.empty())
    throw Error(ErrorCode::kConfig,
                fmt::format("the configuration is valid, but the training engine cannot run {} of its settings yet:\n  {}",
                            missing.size() == 1 ? "one" : std::to_string(missing.size()), fmt::join(missing, "\n  ")),
                "change these settings, or check the plan without training with --dry-run");
  for (const auto& warning : recipe.warnings) log::warn(warning);

  const RunDir run_dir(recipe.run_dir);
  if (options.resume) {
    if (!ckpt::latest_checkpoint(run_dir.ckpt_dir(recipe)))
      throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint to resume from", recipe.run_dir),
                  "start it with `dstrain train` instead");
  } else {
    run_dir.prepare_new(recipe);
  }

  const std::string run_id = random_run_id();
  const auto timeout = std::chrono::milliseconds(recipe.launch.timeout_s * 1000);
  comm::StoreServer store(recipe.launch.master_addr, static_cast<int>(recipe.launch.master_port), run_id, timeout);
  const int threads = threads_per_worker(static_cast<int>(recipe.launch.threads_per_worker), world, online_cores());
  log::info(fmt::format("dstrain {} run {}: {} worker{} x {} thread{}, rendezvous at {}:{}", options.resume ? "resuming" : "starting", run_id,
                        world, world == 1 ? "" : "s", threads, threads == 1 ? "" : "s", recipe.launch.master_addr, store.port()));
  log::info(describe_plan(recipe));

  launch::SupervisorOptions sup;
  sup.executable = options.executable;
  sup.worker_args = {"worker"};
  sup.log_dir = run_dir.log_dir();
  for (int rank = 0; rank < world; ++rank) {
    launch::WorkerEnv env;
    env.rank = rank;
    env.local_rank = rank;
    env.world_size = world;
    env.local_world_size = world;
    env.master_addr = recipe.launch.master_addr;
    env.master_port = store.port();
    env.run_id = run_id;
    env.run_dir = recipe.run_dir;
    env.threads = threads;
    env.resume = options.resume;
    sup.workers.push_back(env);
  }
  const int status = launch::supervise(sup);
  if (status == 0) log::info(fmt::format("run finished; metrics in {}, checkpoints in {}", run_dir.metrics_path(), run_dir.ckpt_dir(recipe)));
  return status;
}

}  // namespace dstrain::train
