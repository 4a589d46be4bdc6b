#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/log.h"
#include "dstrain/launch/plan.h"
#include "dstrain/model/freeze.h"
#include "dstrain/tasks/env_task.h"
#include "dstrain/data/fine_tuning.h"
#include "launch_flags.h"

namespace dstrain::app {

void register_check_env(CLI::App& app, Run& run) {
  struct Args {
    std::string recipe;
    std::vector<std::string> overrides;
    bool json = false;
    bool local = false;
    std::vector<std::string> skip;
    tasks::EnvCheckTask task;
    launch::LaunchFlags flags;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "check-env", "Check that every rank's software, hardware, config and data agree, and probe network, devices and disk");
  cmd->footer(
      "Starts the workers as `train` would (the same flags, torchrun, Slurm and mpirun environments),\n"
      "gathers every rank's facts and compares them: versions and hashes must be equal on every rank,\n"
      "hardware and limits within a node; the clock offset from rank 0 and the checkpoint directory's\n"
      "free space have limits; measurements (GEMM, disk, links) flag ranks under half the median.\n"
      "For each mismatch the report shows the groups of ranks holding each value.\n"
      "With a recipe, its resolved config, recipe file, ds_config and dataset files are hashed too\n"
      "(checksums are cached by file identity in ~/.cache/dstrain), and its checkpoint dir is checked.\n"
      "`train` runs the same check (without probes) before training unless --skip-env-check.\n\n"
      "Exit codes: 0 consistent, 1 mismatch, 2 usage; 5/6/7 when the check itself could not run.\n\n"
      "Examples:\n"
      "  dstrain check-env --local                      (this machine's facts, no workers)\n"
      "  dstrain check-env --nproc-per-node 4\n"
      "  dstrain check-env recipes/demo.yaml --nproc-per-node 2 --json\n"
      "  dstrain check-env r.yaml --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500   (on node 0)\n"
      "  srun --ntasks-per-node=1 dstrain check-env r.yaml --nproc-per-node 8 --skip pairwise");
  cmd->add_option("recipe", args->recipe, "Recipe whose config, data and checkpoint dir to check as well")->check(CLI::ExistingFile);
  cmd->add_option("--set", args->overrides, "Override a recipe key, KEY.PATH=VALUE (repeatable)");
  add_launch_flags(*cmd, args->flags);
  cmd->add_flag("--local", args->local, "This process only: no workers, no rendezvous; prints this machine's facts");
  cmd->add_flag("--json", args->json, "Print the report as one JSON object (schema: docs/check-env.schema.json)");
  cmd->add_option("--skip", args->skip, "Probes to skip: allreduce, pairwise, gemm, disk, or probes (all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"allreduce", "pairwise", "gemm", "disk", "probes"}));
  cmd->add_option("--max-clock-skew", args->task.probes.max_clock_skew_s,
                  "Largest clock offset from rank 0 that passes, in seconds (default 1)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--timeout", args->task.timeout_s, "Rendezvous and collective timeout, seconds (default 120)")
      ->check(CLI::Range(1, 86400));
  cmd->callback([args, &run] {
    run = [args] {
      for (const auto& s : args->skip) {
        const bool all = s == "probes";
        if (all || s == "allreduce") args->task.probes.allreduce = false;
        if (all || s == "pairwise") args->task.probes.pairwise = false;
        if (all || s == "gemm") args->task.probes.gemm = false;
        if (all || s == "disk") args->task.probes.disk = false;
      }
      // The recipe as it will run: resolved for the topology (--local: this process alone).
      launch::Topology topo;
      std::string temp_dir;
      if (!args->recipe.empty()) {
        config::Recipe recipe;
        // Data this node lacks is what the check is for: reported among the facts, on every rank.
        config::LoadOptions lenient;
        lenient.data_may_be_missing = true;
        lenient.packed_rows = data::packed_rows_of;
        lenient.frozen_counts = model::frozen_counts_of;  // train.epochs (plan_recipe sets it too; --local needs it here)
        if (args->local) {
          recipe = config::load_recipe(args->recipe, args->overrides, {}, lenient);
        } else {
          launch::RunPlan plan = launch::plan_recipe(args->recipe, args->overrides, args->flags, lenient);
          recipe = std::move(plan.recipe);
          topo = plan.topology;
        }
        for (const auto& warning : recipe.warnings) log::warn(warning);
        recipe.launch.node_rank = 0;  // the one value that differs by node: not part of what must agree
        temp_dir = (std::filesystem::temp_directory_path() / fmt::format("dstrain-check-env-config-{}", ::getpid())).string();
        std::filesystem::create_directories(temp_dir);
        args->task.config_path = temp_dir + "/config.resolved.json";
        config::write_resolved_config(recipe, args->task.config_path);
      } else if (!args->local) {
        topo = launch::decide_topology(args->flags, 1, false, 1, "127.0.0.1", 0);
      }
      int status = 0;
      if (args->local)
        status = tasks::run_env_local(args->task, args->json);
      else if (topo.mode == launch::Topology::Mode::kRank)
        status = tasks::run_env_task_as_rank(topo, args->task);
      else
        status = tasks::launch_env_task(topo, args->task, args->json, self_executable());
      if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
      return status;
    };
  });
}

}  // namespace dstrain::app
