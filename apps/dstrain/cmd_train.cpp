#include <CLI/CLI.hpp>

#include <filesystem>

#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/launch/launch_run.h"
#include "dstrain/launch/plan.h"
#include "dstrain/launch/preflight.h"
#include "dstrain/sched/lr_schedule.h"
#include "dstrain/core/error.h"
#include "dstrain/run/run_dir.h"
#include "dstrain_cuda.h"
#include "launch_flags.h"

namespace dstrain::app {

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "dstrain";
}

void register_train(CLI::App& app, Run& run) {
  struct Args {
    std::string recipe;
    std::vector<std::string> overrides;
    bool dry_run = false;
    bool show_schedule = false;
    std::string resume_from;
    int max_restarts = -1;
    double max_time = -1;
    bool skip_env_check = false;
    launch::LaunchFlags flags;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a recipe: starts the workers and supervises them");
  cmd->footer(
      "The run directory (run_dir in the recipe) receives config.resolved.json, logs/rank_XXXXX.log,\n"
      "metrics.jsonl and ckpt/. A run_dir that already holds a run is refused: resume it instead.\n\n"
      "Topology, first match wins: the flags below; a torchrun environment (this process is that\n"
      "rank); Slurm (one task per node: a launcher per node; one task per GPU: each task a rank);\n"
      "OpenMPI (mpirun); PMI; else the recipe's launch section. --dry-run shows the decision.\n\n"
      "Examples:\n"
      "  dstrain train recipes/demo.yaml\n"
      "  dstrain train recipes/demo.yaml --set train.steps=20 --set run_dir=runs/short\n"
      "  dstrain train recipes/demo.yaml --nproc-per-node 1 --dry-run\n"
      "  dstrain train recipes/deepseek-llm-7b.yaml --dry-run      (a ds_config recipe: see the sources)\n"
      "  dstrain train recipes/demo.yaml --set run_dir=runs/z3 --set zero.stage=3 --resume runs/demo/ckpt\n"
      "      (a new run from another run's checkpoint: any ZeRO stage, world size or precision)\n"
      "  dstrain train r.yaml --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500   (on node 0)\n"
      "  dstrain train r.yaml --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500   (on node 1)\n\n"
      "Precedence: built-in defaults < recipe < ds_config (ds_config: or deepspeed:) < --set < topology.");
  cmd->add_option("recipe", args->recipe, "Recipe YAML file (see recipes/README.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", args->overrides, "Override a recipe key, KEY.PATH=VALUE (repeatable), e.g. --set optimizer.lr=1e-3");
  add_launch_flags(*cmd, args->flags);
  cmd->add_option(
         "--max-restarts", args->max_restarts,
         "Restart the whole group this many times after a worker failure, from the latest checkpoint (= --set launch.max_restarts)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--max-time", args->max_time,
                  "Wall-time budget in minutes: then every rank stops at one step boundary with a checkpoint, exit 75 (= --set "
                  "launch.max_time_minutes)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--resume", args->resume_from,
                  "PATH: start this new run from a checkpoint of another run (a step directory, or a ckpt/ directory whose newest "
                  "verifying checkpoint is used): weights, optimizer state, step and data position carry over. auto: continue "
                  "run_dir if it holds this same run with a committed checkpoint, else start it (for job scripts that rerun one command)")
      ->check(CLI::IsMember({"auto"}) | CLI::ExistingDirectory);
  cmd->add_flag("--skip-env-check", args->skip_env_check,
                "Do not compare the ranks' software, hardware, config and data files before training (launch.env_check)");
  cmd->add_flag("--dry-run", args->dry_run,
                "Validate, then print the topology decision, every resolved key with its source (default, recipe\n"
                "file:line:col, ds_config, --set) and the derived numbers (batch per stage, tokens, parameters,\n"
                "per-rank memory; with parallel.pipeline_parallel_size > 1 the stages, the schedule's bubble and the\n"
                "memory per pipeline rank); start nothing");
  cmd->add_flag("--show-schedule", args->show_schedule,
                "With --dry-run and pipeline parallelism: every pipeline rank's actions (forward, backward, sends,\n"
                "receives) as the schedule orders them, checked, and a chart of their replay");
  cmd->callback([args, &run] {
    run = [args] {
      if (args->show_schedule && !args->dry_run)
        throw Error(ErrorCode::kUsage, "--show-schedule prints the pipeline schedule of a --dry-run", "add --dry-run");
      if (args->max_restarts >= 0) args->overrides.push_back("launch.max_restarts=" + std::to_string(args->max_restarts));
      if (args->max_time >= 0) args->overrides.push_back(fmt::format("launch.max_time_minutes={}", args->max_time));
      const launch::RunPlan plan = launch::plan_recipe(args->recipe, args->overrides, args->flags);
      const config::Recipe& recipe = plan.recipe;
      const launch::Topology& topo = plan.topology;
      if (args->dry_run) {
        launch::refuse_mismatched_init_weights(recipe);  // what training would find first
        launch::refuse_unreadable_tasks(recipe);
        std::string out = topo.describe() + "\n" + cost::describe_resolved(recipe, args->show_schedule);
        out += fmt::format("  LR schedule             {}\n", sched::describe_lr(recipe));
        // This node's first GPU, when it has one: does the plan fit it?
        char gpu[256] = {0};
        int major = 0, minor = 0;
        size_t total = 0;
        if (dstrain_cuda_device_count() > 0 && dstrain_cuda_device_name(0, gpu, sizeof gpu) == 0 &&
            dstrain_cuda_device_props(0, &major, &minor, &total) == 0 && total > 0) {
          const cost::MemoryPlan memory = cost::memory_plan(recipe);
          out += fmt::format("  on this node's GPU 0    {} ({:.1f} GiB): {} (at most ~{:.3g} parameters at this shape, batch and mode)\n",
                             gpu, static_cast<double>(total) / 1073741824.0,
                             memory.device_total() <= 0.9 * static_cast<double>(total) ? "fits" : "does not fit",
                             cost::largest_model_fitting(recipe, static_cast<double>(total)));
        }
        for (const auto& w : recipe.warnings) out += "warning: " + w + "\n";
        if (recipe.lora.enabled() && recipe.lora.base != config::LoraBase::kModel && recipe.model.init_from.empty())
          out += fmt::format("note: lora.base {} quantizes model.init_from's weights: training needs it set (this plan does not)\n",
                             config::name(recipe.lora.base));
        out += "the configuration is valid; --dry-run: no worker started, nothing written\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
      }
      launch::refuse_quantized_base_without_weights(recipe);
      const launch::ResumeChoice resume = launch::choose_resume(recipe, args->resume_from);
      const launch::LaunchOptions options{self_executable(), resume.resume, resume.from, topo, !args->skip_env_check};
      return topo.mode == launch::Topology::Mode::kRank ? launch::run_as_rank(recipe, options) : launch::launch_run(recipe, options);
    };
  });
}

}  // namespace dstrain::app
