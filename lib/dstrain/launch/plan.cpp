#include "dstrain/launch/plan.h"

#include <fmt/format.h>

#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/freeze.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/data/fine_tuning.h"
#include "dstrain_cuda.h"

namespace dstrain::launch {
namespace fs = std::filesystem;

Topology decide_topology(const LaunchFlags& flags, int recipe_nproc, bool recipe_nproc_given, int recipe_nnodes,
                         const std::string& recipe_master_addr, int recipe_master_port) {
  return detect_topology(flags, current_environment(), recipe_nproc_given ? recipe_nproc : 0, recipe_nnodes, recipe_master_addr,
                         recipe_master_port, dstrain_cuda_device_count());
}

RunPlan plan_recipe(const std::string& recipe_path, const std::vector<std::string>& overrides, const LaunchFlags& flags,
                    const config::LoadOptions& options) {
  RunPlan plan;
  // The topology layer: decided from the layered launch section, recorded as its own source. A
  // key the user --set keeps that source when the topology only echoes the recipe.
  const config::LastLayer topology_layer = [&](const config::Recipe& layered) {
    const auto& l = layered.launch;
    plan.topology = decide_topology(flags, static_cast<int>(l.nproc_per_node), layered.sources.at("launch.nproc_per_node") != "default",
                                    static_cast<int>(l.nnodes), l.master_addr, static_cast<int>(l.master_port));
    const Topology& t = plan.topology;
    const std::pair<std::string, std::string> values[] = {{"launch.nproc_per_node", std::to_string(t.nproc_per_node)},
                                                          {"launch.nnodes", std::to_string(t.nnodes)},
                                                          {"launch.node_rank", std::to_string(t.node_rank)},
                                                          {"launch.master_addr", t.master_addr},
                                                          {"launch.master_port", std::to_string(t.master_port)}};
    std::vector<config::LayerValue> out;
    for (const auto& [key, value] : values) {
      const bool keep_set = layered.sources.at(key) == "--set" && t.source == "recipe";
      out.push_back({key + "=" + value, keep_set ? "--set" : "topology: " + t.source});
    }
    return out;
  };
  config::LoadOptions with_data = options;
  if (!with_data.packed_rows) with_data.packed_rows = data::packed_rows_of;         // train.epochs
  if (!with_data.frozen_counts) with_data.frozen_counts = model::frozen_counts_of;  // train.freeze
  plan.recipe = config::load_recipe(recipe_path, overrides, topology_layer, with_data);
  return plan;
}

RunPlan plan_resume(const std::string& run_dir_arg, const LaunchFlags& flags, int max_restarts) {
  const run::RunDir dir(fs::absolute(run_dir_arg).lexically_normal().string());
  if (!fs::exists(dir.root()))
    throw Error(ErrorCode::kUsage, fmt::format("run directory '{}' does not exist", run_dir_arg),
                "pass the run_dir of an earlier `dstrain train` (dstrain resume RUN_DIR)");
  if (!fs::exists(dir.config_path()))
    throw Error(ErrorCode::kUsage, "'" + run_dir_arg + "' is not a dstrain run directory (no config.resolved.json)",
                "pass the run_dir of an earlier `dstrain train`");
  const config::Recipe saved = config::read_resolved_config(dir.config_path());
  RunPlan plan;
  plan.topology = decide_topology(flags, static_cast<int>(saved.launch.nproc_per_node), true, static_cast<int>(saved.launch.nnodes),
                                  saved.launch.master_addr, static_cast<int>(saved.launch.master_port));
  const Topology& topo = plan.topology;
  // Another number of ranks: same global batch and data order, new accumulation steps. The
  // checkpoints hold full tensors and a global data cursor, so they load on any count.
  config::Recipe& recipe = plan.recipe = config::resized_for(saved, topo.nproc_per_node, topo.nnodes);
  // The launcher alone reads max_restarts: the workers keep the saved config untouched.
  if (max_restarts >= 0) recipe.launch.max_restarts = max_restarts;
  // A run directory that was copied or moved resumes where it now is: writing into the
  // original (its config still names it) would overwrite another run's checkpoints.
  const bool moved = fs::absolute(saved.run_dir).lexically_normal() != fs::path(dir.root());
  if (moved) {
    recipe.run_dir = dir.root();
    recipe.sources["run_dir"] = "dstrain resume " + dir.root() + " (the config named " + saved.run_dir + ")";
  }
  const bool writer = topo.mode == Topology::Mode::kRank ? topo.rank == 0 : topo.node_rank == 0;
  if (!writer || (!moved && recipe.world_size() == saved.world_size())) return plan;
  config::write_resolved_config(recipe, dir.config_path());
  if (moved)
    log::info(
        fmt::format("the run directory was moved or copied from {}: resuming in {}{}", saved.run_dir, dir.root(),
                    recipe.checkpoint.dir.empty() ? "" : fmt::format(" (checkpoints stay in checkpoint.dir {})", recipe.checkpoint.dir)));
  if (recipe.world_size() != saved.world_size())
    log::info(fmt::format("resuming on {} ranks instead of {}: {} accumulation step{} of {} per rank keep the global batch of {}",
                          recipe.world_size(), saved.world_size(), recipe.train.gradient_accumulation_steps,
                          recipe.train.gradient_accumulation_steps == 1 ? "" : "s", recipe.train.micro_batch_size,
                          recipe.train.global_batch_size));
  return plan;
}

ResumeChoice choose_resume(const config::Recipe& recipe, const std::string& arg) {
  if (arg.empty()) return {};
  if (arg != "auto") {
    const std::string from = fs::absolute(arg).lexically_normal().string();
    if (!fs::exists(fs::path(from) / "manifest.json") && !ckpt::has_committed_checkpoint(from))
      throw Error(ErrorCode::kUsage,
                  fmt::format("--resume {}: neither a checkpoint (no manifest.json) nor a directory of committed checkpoints", arg),
                  "pass RUN_DIR/ckpt or RUN_DIR/ckpt/step_XXXXXXXX");
    return {true, from};
  }
  const run::RunDir dir(recipe.run_dir);
  if (!fs::exists(dir.config_path())) return {};
  const config::Recipe saved = config::read_resolved_config(dir.config_path());
  if (config::config_hash(saved) != config::config_hash(recipe))
    throw Error(ErrorCode::kUsage,
                fmt::format("--resume auto: run_dir '{}' holds a run with another configuration (hash {} vs {})", recipe.run_dir,
                            config::config_hash(saved), config::config_hash(recipe)),
                "use `dstrain resume RUN_DIR` to continue it as it was configured, or another run_dir");
  // Stopped before its first save (a requeued job pre-empted early): nothing to resume, so it
  // starts again, and the new run takes the directory over (RunDir::prepare_new).
  if (!ckpt::has_committed_checkpoint(dir.ckpt_dir(saved))) {
    log::info(fmt::format("--resume auto: run_dir '{}' holds this run without a committed checkpoint: starting it again", recipe.run_dir));
    return {};
  }
  return {true, ""};
}

std::string describe_plan(const config::Recipe& r) {
  const int64_t world = r.world_size();
  return fmt::format(
      "run_dir {}\n  model: {} H={} layers={} heads={} vocab={} ({:.3f}M parameters)\n  data: {} ({} format, seq_len {})\n"
      "  batch: global {} = micro {} x {} ranks x {} accumulation{}; {} tokens/step; {} steps\n"
      "  optimizer: {} lr {:g}; schedule {} ({} warmup steps); {}, ZeRO stage {}",
      r.run_dir, config::name(r.model.family), r.model.hidden_size, r.model.num_layers, r.model.num_heads, r.model.vocab_size,
      static_cast<double>(cost::parameter_counts(r.model).total) / 1e6, r.data.path, config::name(r.data.format), r.data.seq_len,
      config::global_batch_at(r, 0), r.train.micro_batch_size, world, config::accumulation_at(r, 0),
      r.train.accumulation.empty() ? "" : " (first stage)", config::global_batch_at(r, 0) * r.data.seq_len, r.train.steps,
      config::name(r.optimizer.type), r.optimizer.lr, config::name(r.schedule.type), r.schedule.warmup_steps,
      config::name(r.precision.dtype), r.zero.stage);
}

}  // namespace dstrain::launch
