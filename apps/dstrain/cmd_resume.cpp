#include <CLI/CLI.hpp>

#include <filesystem>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/train/launch_run.h"
#include "dstrain/train/run_dir.h"

namespace dstrain::app {

void register_resume(CLI::App& app, Run& run) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("resume", "Continue a run from its newest committed checkpoint");
  cmd->footer(
      "Reads RUN_DIR/config.resolved.json (the config the run started with) and ckpt/latest, then\n"
      "starts the workers again. Model, optimizer state, step and data position are restored, so the\n"
      "resumed run continues exactly as the uninterrupted one would have.\n\n"
      "Example:\n"
      "  dstrain resume runs/demo");
  cmd->add_option("run_dir", *run_dir, "Run directory of an earlier `dstrain train`")->required();
  cmd->callback([run_dir, &run] {
    run = [run_dir] {
      const train::RunDir dir(std::filesystem::absolute(*run_dir).lexically_normal().string());
      if (!std::filesystem::exists(dir.config_path()))
        throw Error(ErrorCode::kUsage, "'" + *run_dir + "' is not a dstrain run directory (no config.resolved.json)",
                    "pass the run_dir of an earlier `dstrain train`");
      const config::Recipe recipe = config::read_resolved_config(dir.config_path());
      return train::launch_run(recipe, {self_executable(), true});
    };
  });
}

}  // namespace dstrain::app
