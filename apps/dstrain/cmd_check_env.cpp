#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "dstrain/envcheck/facts.h"

namespace dstrain::app {

void register_check_env(CLI::App& app, Run& run) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("check-env", "Show this node's software stack and hardware as dstrain sees them");
  cmd->footer(
      "Prints host, OS, kernel, CPU, memory, dstrain build, LibTorch, CUDA, NCCL and GPUs.\n"
      "This version checks the local node only; comparing every rank of a job comes next.\n\n"
      "Examples:\n"
      "  dstrain check-env\n"
      "  dstrain check-env --json > facts.json");
  cmd->add_flag("--json", *json, "Print one JSON object instead of a table");
  cmd->callback([json, &run] {
    run = [json] {
      const auto facts = envcheck::collect_local_facts();
      if (*json) {
        std::string out = "{";
        for (size_t i = 0; i < facts.size(); ++i) {
          std::string v;
          for (char c : facts[i].second) v += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
          out += fmt::format("{}\"{}\": \"{}\"", i ? ", " : "", facts[i].first, v);
        }
        fmt::print("{}}}\n", out);
      } else {
        size_t width = 0;
        for (const auto& f : facts) width = std::max(width, f.first.size());
        for (const auto& f : facts) fmt::print("{:<{}}  {}\n", f.first, width, f.second);
      }
      return 0;
    };
  });
}

}  // namespace dstrain::app
