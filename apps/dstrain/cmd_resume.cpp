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
  cmd->callback([run_dir, flags, &run] {
    run = [run_dir, flags] {
      const train::RunDir dir(std::filesystem::absolute(*run_dir).lexically_normal().string());
      if (!std::filesystem::exists(dir.config_path()))
        throw Error(ErrorCode::kUsage, "'" + *run_dir + "' is not a dstrain run directory (no config.resolved.json)",
                    "pass the run_dir of an earlier `dstrain train`");
      const config::Recipe recipe = config::read_resolved_config(dir.config_path());
      const launch::Topology topo = decide_topology(*flags, static_cast<int>(recipe.launch.nproc_per_node), true, static_cast<int>(recipe.launch.nnodes),
                                                    recipe.launch.master_addr, static_cast<int>(recipe.launch.master_port));
      if (topo.world() != recipe.world_size())
        throw Error(ErrorCode::kUsage,
                    fmt::format("the run was configured for {} ranks but this resume would start {}", recipe.world_size(), topo.world()),
                    "resume with the same number of ranks (resharding onto another rank count comes with the checkpoint issue)");
      const train::LaunchOptions options{self_executable(), true, topo};
      return topo.mode == launch::Topology::Mode::kRank ? train::run_as_rank(recipe, options) : train::launch_run(recipe, options);
    };
  });
}

}  // namespace dstrain::app
