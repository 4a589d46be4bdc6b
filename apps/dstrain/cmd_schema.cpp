#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"

namespace dstrain::app {

// Hidden: prints the recipe keys as Markdown (scripts/gen-recipe-docs.sh puts it in recipes/README.md).
void register_schema(CLI::App& app, Run& run) {
  CLI::App* cmd = app.add_subcommand("schema", "Print the recipe keys as a Markdown table");
  cmd->group("");
  cmd->callback([&run] {
    run = [] {
      const std::string text = cost::schema_markdown();
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    };
  });
}

}  // namespace dstrain::app
