#include <CLI/CLI.hpp>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/train/launch_run.h"

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
    int nproc = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a recipe: starts the workers and supervises them");
  cmd->footer(
      "The run directory (run_dir in the recipe) receives config.resolved.json, logs/rank_XXXXX.log,\n"
      "metrics.jsonl and ckpt/. A run_dir that already holds a run is refused: resume it instead.\n\n"
      "Examples:\n"
      "  dstrain train recipes/demo.yaml\n"
      "  dstrain train recipes/demo.yaml --set train.steps=20 --set run_dir=runs/short\n"
      "  dstrain train recipes/demo.yaml --nproc-per-node 1 --dry-run");
  cmd->add_option("recipe", args->recipe, "Recipe YAML file (see recipes/README.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", args->overrides, "Override a recipe key, KEY.PATH=VALUE (repeatable), e.g. --set train.lr=1e-3");
  cmd->add_option("--nproc-per-node", args->nproc, "Worker processes on this node (overrides launch.nproc_per_node)")->check(CLI::Range(1, 1024));
  cmd->add_flag("--dry-run", args->dry_run, "Validate the recipe, print the plan, and exit without starting workers");
  cmd->callback([args, &run] {
    run = [args] {
      auto overrides = args->overrides;
      if (args->nproc > 0) overrides.push_back("launch.nproc_per_node=" + std::to_string(args->nproc));
      const config::Recipe recipe = config::load_recipe(args->recipe, overrides);
      if (args->dry_run) {
        std::printf("%s\nrecipe is valid; --dry-run: no worker started\n", train::describe_plan(recipe).c_str());
        return 0;
      }
      return train::launch_run(recipe, {self_executable(), false});
    };
  });
}

}  // namespace dstrain::app
