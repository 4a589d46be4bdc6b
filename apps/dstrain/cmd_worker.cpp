#include <CLI/CLI.hpp>

#include "commands.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/train/comm_task.h"
#include "dstrain/train/worker.h"

namespace dstrain::app {

// Hidden: the launcher re-executes this binary as `dstrain worker` with the WorkerEnv variables.
void register_worker(CLI::App& app, Run& run) {
  struct Args {
    std::string task = "train";
    train::CommTask comm;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("worker", "Run one rank (started by the launcher)");
  cmd->group("");  // hidden from --help
  cmd->add_option("--task", args->task)->check(CLI::IsMember({"train", "comm-check", "comm-bench"}));
  cmd->add_option("--min-bytes", args->comm.bench.min_bytes);
  cmd->add_option("--max-bytes", args->comm.bench.max_bytes);
  cmd->add_option("--iters", args->comm.bench.max_iters);
  cmd->add_option("--timeout", args->comm.timeout_s);
  cmd->add_option("--backend", args->comm.backend);
  cmd->callback([args, &run] {
    run = [args] {
      const launch::WorkerEnv env = launch::worker_env_from_environment();
      if (args->task == "train") return train::run_worker(env);
      args->comm.check = args->task == "comm-check";
      return train::run_comm_task(env, args->comm);
    };
  });
}

}  // namespace dstrain::app
