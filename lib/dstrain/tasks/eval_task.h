#pragma once
// `dstrain eval` as a task: the launcher starts this node's workers (or this process is one rank
// of a torchrun/srun/mpirun job); each rank builds the model in the recipe's dtype, reads the
// weights (a checkpoint's fp32 master weights, or a Hugging Face folder's) without an engine or
// optimizer state, and runs train::Evaluator over the sets; node 0 prints one row per set (or
// JSON: {"step", "datasets": [{"name", "val_loss", "val_ppl", "val_tokens", ...}]}).
#include <string>
#include <vector>

#include "dstrain/launch/topology.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::run {
struct WorkerEnv;
}

namespace dstrain::tasks {

struct EvalTarget;

struct EvalTask {
  std::string config_path;  // the recipe to evaluate with (tasks::eval_recipe), as a resolved config
  std::string checkpoint;   // the weights; "": model.init_from (a Hugging Face folder)
  int64_t step = -1;        // the checkpoint's step (-1: none)
  std::string result_path;  // rank 0 writes the results (JSON) here; "": prints them (json or a table)
  bool json = false;
  int timeout_s = 300;
  std::string choice_tasks;  // --task: the tokenized tasks (tasks/task_scoring.h), as JSON in this file; "": the sets
  std::string samples_path;  // --log-samples: rank 0 writes each question's log-likelihoods here (JSON Lines)
};

// Worker-process arguments that carry the task (after "worker").
std::vector<std::string> eval_task_args(const EvalTask& task);
// This process as the rank env describes.
int run_eval_task(const run::WorkerEnv& env, const EvalTask& task);
// Evaluates `target` with `recipe` (eval_recipe's) on the topology: this node's workers, or this
// process as one rank; node 0 prints the results. Returns the exit status.
// choice_tasks: encode_tasks' JSON (then only the tasks are scored); "": the recipe's sets.
int evaluate_target(const launch::Topology& topology, const EvalTarget& target, const config::Recipe& recipe, bool json, int timeout_s,
                    const std::string& executable, const std::string& choice_tasks = "", const std::string& samples_path = "");

}  // namespace dstrain::tasks
