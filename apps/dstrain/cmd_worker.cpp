#include <CLI/CLI.hpp>

#include "commands.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/tasks/comm_task.h"
#include "dstrain/tasks/env_task.h"
#include "dstrain/tasks/eval_task.h"
#include "dstrain/train/worker.h"

namespace dstrain::app {

// Hidden: the launcher re-executes this binary as `dstrain worker` with the WorkerEnv variables.
void register_worker(CLI::App& app, Run& run) {
  struct Args {
    std::string task = "train";
    tasks::CommTask comm;
    tasks::EnvCheckTask env_check;
    tasks::EvalTask eval;
    std::string skip;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("worker", "Run one rank (started by the launcher)");
  cmd->group("");  // hidden from --help
  cmd->add_option("--task", args->task)->check(CLI::IsMember({"train", "comm-check", "comm-bench", "check-env", "eval"}));
  cmd->add_option("--report", args->env_check.report_path);
  cmd->add_option("--config", args->env_check.config_path);
  cmd->add_option("--max-clock-skew", args->env_check.probes.max_clock_skew_s);
  cmd->add_option("--skip", args->skip);
  cmd->add_option("--min-bytes", args->comm.bench.min_bytes);
  cmd->add_option("--max-bytes", args->comm.bench.max_bytes);
  cmd->add_option("--iters", args->comm.bench.max_iters);
  cmd->add_option("--timeout", args->comm.timeout_s);
  cmd->add_option("--backend", args->comm.backend);
  cmd->add_option("--checkpoint", args->eval.checkpoint);
  cmd->add_option("--step", args->eval.step);
  cmd->add_option("--result", args->eval.result_path);
  cmd->add_option("--choice-tasks", args->eval.choice_tasks);
  cmd->add_option("--samples", args->eval.samples_path);
  cmd->callback([args, &run] {
    run = [args] {
      const run::WorkerEnv env = run::worker_env_from_environment();
      if (args->task == "train") return train::run_worker(env);
      if (args->task == "eval") {
        args->eval.config_path = args->env_check.config_path;
        args->eval.timeout_s = args->comm.timeout_s;
        return tasks::run_eval_task(env, args->eval);
      }
      if (args->task == "check-env") {
        args->env_check.timeout_s = args->comm.timeout_s;
        for (const auto& [flag, name] : {std::pair{&args->env_check.probes.allreduce, "allreduce"},
                                         {&args->env_check.probes.pairwise, "pairwise"},
                                         {&args->env_check.probes.gemm, "gemm"},
                                         {&args->env_check.probes.disk, "disk"}})
          if (args->skip.find(name) != std::string::npos) *flag = false;
        return tasks::run_env_task(env, args->env_check, /*print=*/false);
      }
      args->comm.check = args->task == "comm-check";
      return tasks::run_comm_task(env, args->comm);
    };
  });
}

}  // namespace dstrain::app
