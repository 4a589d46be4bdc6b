#include <CLI/CLI.hpp>

#include "commands.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/train/worker.h"

namespace dstrain::app {

// Hidden: the launcher re-executes this binary as `dstrain worker` with the WorkerEnv variables.
void register_worker(CLI::App& app, Run& run) {
  CLI::App* cmd = app.add_subcommand("worker", "Run one training rank (started by the launcher)");
  cmd->group("");  // hidden from --help
  cmd->callback([&run] { run = [] { return train::run_worker(launch::worker_env_from_environment()); }; });
}

}  // namespace dstrain::app
