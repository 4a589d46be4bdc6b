#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/build_info.h"
#include "dstrain/core/error.h"
#include "dstrain/run/run_dir.h"

namespace dstrain::app {
namespace {
namespace fs = std::filesystem;

// The tensorboard program: on PATH, else in the virtualenv dstrain was built against (where
// scripts/setup.sh installs it), else in $DSTRAIN_VENV.
std::string find_tensorboard() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream in(path);
    for (std::string dir; std::getline(in, dir, ':');) dirs.push_back(dir.empty() ? "." : dir);
  }
  if (!build_info().python_bin_dir.empty()) dirs.push_back(build_info().python_bin_dir);
  if (const char* venv = std::getenv("DSTRAIN_VENV")) dirs.push_back(std::string(venv) + "/bin");
  for (const auto& dir : dirs) {
    const std::string candidate = dir + "/tensorboard";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw Error(ErrorCode::kEnvironment,
              fmt::format("tensorboard is not installed (not on PATH{})",
                          build_info().python_bin_dir.empty() ? "" : ", nor in " + build_info().python_bin_dir),
              "install it with `pip install tensorboard`, or run scripts/setup.sh, which puts it in dstrain's virtualenv");
}

}  // namespace

void register_tensorboard(CLI::App& app, Run& run) {
  struct Args {
    std::string run_dir, host = "127.0.0.1";
    int port = 6006;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("tensorboard", "Serve a run's TensorBoard event files (TensorBoard from dstrain's virtualenv)");
  cmd->footer(
      "Runs `tensorboard --logdir` on the run's event files: RUN_DIR/tensorboard, or the run's\n"
      "logging.tensorboard_dir. The run writes them with `logging: {sinks: [console, jsonl, tensorboard]}`\n"
      "(or a ds_config's \"tensorboard\" section). tensorboard is looked for on PATH, then in the\n"
      "virtualenv this dstrain was built against (scripts/setup.sh installs it there), then in $DSTRAIN_VENV.\n"
      "It serves until Ctrl-C. `dstrain report RUN_DIR` writes the same curves as an HTML page instead.\n\n"
      "Examples:\n"
      "  dstrain tensorboard runs/demo                 (then open http://127.0.0.1:6006)\n"
      "  dstrain tensorboard runs/demo --host 0.0.0.0 --port 8080");
  cmd->add_option("run_dir", args->run_dir, "Run directory of a `dstrain train`")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--port", args->port, "Port to serve on (default 6006)")->check(CLI::Range(1, 65535));
  cmd->add_option("--host", args->host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->callback([args, &run] {
    run = [args]() -> int {
      const run::RunDir dir(fs::absolute(args->run_dir).lexically_normal().string());
      if (!fs::exists(dir.config_path()))
        throw Error(ErrorCode::kUsage, fmt::format("'{}' is not a dstrain run directory (no config.resolved.json)", args->run_dir),
                    "pass the run_dir of a `dstrain train`");
      const config::Recipe recipe = config::read_resolved_config(dir.config_path());
      const std::string logdir = recipe.logging.tensorboard_dir.empty() ? dir.root() + "/tensorboard" : recipe.logging.tensorboard_dir;
      if (!fs::is_directory(logdir))
        throw Error(ErrorCode::kUsage, fmt::format("run '{}' wrote no TensorBoard events (no {})", args->run_dir, logdir),
                    "add tensorboard to the recipe's logging.sinks, e.g. logging: {sinks: [console, jsonl, tensorboard]}; "
                    "`dstrain report RUN_DIR` charts any run from its metrics.jsonl");
      const std::string program = find_tensorboard();
      const std::string port = std::to_string(args->port);
      std::fprintf(stderr, "%s --logdir %s --host %s --port %s\n", program.c_str(), logdir.c_str(), args->host.c_str(), port.c_str());
      std::fflush(stderr);
      std::vector<const char*> argv{program.c_str(),    "--logdir", logdir.c_str(), "--host",
                                    args->host.c_str(), "--port",   port.c_str(),   nullptr};
      ::execv(program.c_str(), const_cast<char* const*>(argv.data()));
      throw Error(ErrorCode::kEnvironment, fmt::format("could not start {}: {}", program, std::strerror(errno)), "");
    };
  });
}

}  // namespace dstrain::app
