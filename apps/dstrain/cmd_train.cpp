#include <CLI/CLI.hpp>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/describe.h"
#include "dstrain/train/engine_support.h"
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
      "  dstrain train recipes/demo.yaml --nproc-per-node 1 --dry-run\n"
      "  dstrain train recipes/deepseek-llm-7b.yaml --dry-run      (a ds_config recipe: see the sources)\n\n"
      "Precedence: built-in defaults < recipe < ds_config (ds_config: or deepspeed:) < --set.");
  cmd->add_option("recipe", args->recipe, "Recipe YAML file (see recipes/README.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", args->overrides, "Override a recipe key, KEY.PATH=VALUE (repeatable), e.g. --set train.lr=1e-3");
  cmd->add_option("--nproc-per-node", args->nproc, "Worker processes on this node (overrides launch.nproc_per_node)")->check(CLI::Range(1, 1024));
  cmd->add_flag("--dry-run", args->dry_run,
                "Validate, then print every resolved key with its source (default, recipe file:line:col, ds_config, --set)\n"
                "and the derived numbers (batch per stage, tokens, parameters, per-rank memory); start nothing");
  cmd->callback([args, &run] {
    run = [args] {
      auto overrides = args->overrides;
      if (args->nproc > 0) overrides.push_back("launch.nproc_per_node=" + std::to_string(args->nproc));
      const config::Recipe recipe = config::load_recipe(args->recipe, overrides);
      if (args->dry_run) {
        std::string out = config::describe_resolved(recipe);
        for (const auto& w : recipe.warnings) out += "warning: " + w + "\n";
        for (const auto& m : train::unsupported_by_engine(recipe)) out += "not runnable yet: " + m + "\n";
        out += "the configuration is valid; --dry-run: no worker started, nothing written\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
      }
      return train::launch_run(recipe, {self_executable(), false});
    };
  });
}

}  // namespace dstrain::app
