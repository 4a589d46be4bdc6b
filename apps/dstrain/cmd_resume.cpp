#include <CLI/CLI.hpp>

#include <filesystem>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/launch/launch_run.h"
#include "dstrain/launch/plan.h"
#include "dstrain/run/run_dir.h"
#include "launch_flags.h"

#include <fmt/format.h>

namespace dstrain::app {

void register_resume(CLI::App& app, Run& run) {
  auto run_dir = std::make_shared<std::string>();
  auto flags = std::make_shared<launch::LaunchFlags>();
  auto max_restarts = std::make_shared<int>(-1);
  auto skip_env_check = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("resume", "Continue a run from its newest committed checkpoint");
  cmd->footer(
      "Reads RUN_DIR/config.resolved.json (the config the run started with) and ckpt/latest, then\n"
      "starts the workers again. Model, optimizer state, step and data position are restored, so the\n"
      "resumed run continues exactly as the uninterrupted one would have.\n\n"
      "Example:\n"
      "  dstrain resume runs/demo\n"
      "  dstrain resume runs/big --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500");
  cmd->add_option("run_dir", *run_dir, "Run directory of an earlier `dstrain train`")->required();
  add_launch_flags(*cmd, *flags);
  cmd->add_option("--max-restarts", *max_restarts,
                  "Restart the whole group this many times after a worker failure (default: the run's launch.max_restarts)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_flag("--skip-env-check", *skip_env_check, "Do not compare the ranks' software, hardware, config and data files before training");
  cmd->callback([run_dir, flags, max_restarts, skip_env_check, &run] {
    run = [run_dir, flags, max_restarts, skip_env_check] {
      const launch::RunPlan plan = launch::plan_resume(*run_dir, *flags, *max_restarts);
      const config::Recipe& recipe = plan.recipe;
      const launch::Topology& topo = plan.topology;
      const launch::LaunchOptions options{self_executable(), true, "", topo, !*skip_env_check};
      return topo.mode == launch::Topology::Mode::kRank ? launch::run_as_rank(recipe, options) : launch::launch_run(recipe, options);
    };
  });
}

}  // namespace dstrain::app
