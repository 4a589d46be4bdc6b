#include <CLI/CLI.hpp>

#include <filesystem>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/train/launch_run.h"
#include "dstrain/train/run_dir.h"
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
  cmd->add_option("--max-restarts", *max_restarts, "Restart the whole group this many times after a worker failure (default: the run's launch.max_restarts)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_flag("--skip-env-check", *skip_env_check, "Do not compare the ranks' software, hardware, config and data files before training");
  cmd->callback([run_dir, flags, max_restarts, skip_env_check, &run] {
    run = [run_dir, flags, max_restarts, skip_env_check] {
      const train::RunDir dir(std::filesystem::absolute(*run_dir).lexically_normal().string());
      if (!std::filesystem::exists(dir.config_path()))
        throw Error(ErrorCode::kUsage, "'" + *run_dir + "' is not a dstrain run directory (no config.resolved.json)",
                    "pass the run_dir of an earlier `dstrain train`");
      const config::Recipe saved = config::read_resolved_config(dir.config_path());
      const launch::Topology topo = decide_topology(*flags, static_cast<int>(saved.launch.nproc_per_node), true, static_cast<int>(saved.launch.nnodes),
                                                    saved.launch.master_addr, static_cast<int>(saved.launch.master_port));
      // Another number of ranks: same global batch and data order, new accumulation steps. The
      // checkpoints hold full tensors and a global data cursor, so they load on any count.
      config::Recipe recipe = config::resized_for(saved, topo.nproc_per_node, topo.nnodes);
      // The launcher alone reads max_restarts: the workers keep the saved config untouched.
      if (*max_restarts >= 0) recipe.launch.max_restarts = *max_restarts;
      // A run directory that was copied or moved resumes where it now is: writing into the
      // original (its config still names it) would overwrite another run's checkpoints.
      const bool moved = std::filesystem::absolute(saved.run_dir).lexically_normal() != std::filesystem::path(dir.root());
      if (moved) {
        recipe.run_dir = dir.root();
        recipe.sources["run_dir"] = "dstrain resume " + dir.root() + " (the config named " + saved.run_dir + ")";
      }
      const bool writer = topo.mode == launch::Topology::Mode::kRank ? topo.rank == 0 : topo.node_rank == 0;
      if (moved && writer) {
        config::write_resolved_config(recipe, dir.config_path());
        fmt::print(stderr, "the run directory was moved or copied from {}: resuming in {}{}\n", saved.run_dir, dir.root(),
                   recipe.checkpoint.dir.empty() ? "" : fmt::format(" (checkpoints stay in checkpoint.dir {})", recipe.checkpoint.dir));
      }
      if (recipe.world_size() != saved.world_size() && writer) {
        config::write_resolved_config(recipe, dir.config_path());
        fmt::print(stderr, "resuming on {} ranks instead of {}: {} accumulation steps of {} per rank keep the global batch of {}\n", recipe.world_size(),
                   saved.world_size(), recipe.train.gradient_accumulation_steps, recipe.train.micro_batch_size, recipe.train.global_batch_size);
      }
      const train::LaunchOptions options{self_executable(), true, "", topo, !*skip_env_check};
      return topo.mode == launch::Topology::Mode::kRank ? train::run_as_rank(recipe, options) : train::launch_run(recipe, options);
    };
  });
}

}  // namespace dstrain::app
