#pragma once
// What a launch will run: the recipe resolved once, for the topology it runs on.
//   train, check-env  the flags, the environment (torchrun, Slurm, OpenMPI, PMI) and the recipe's
//                     launch section decide the topology; it is the recipe's last layer, so the
//                     batch math is checked for the world size that will really run and the
//                     launch keys' sources say "topology: <where>"
//   resume            the run directory's saved config on this topology: another world size keeps
//                     the global batch (more or fewer accumulation steps); a moved or copied
//                     directory resumes where it now is
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/launch/topology.h"

namespace dstrain::launch {

struct RunPlan {
  config::Recipe recipe;
  Topology topology;
};

// `overrides` are --set; the flags win over the environment, which wins over the recipe.
RunPlan plan_recipe(const std::string& recipe_path, const std::vector<std::string>& overrides, const LaunchFlags& flags,
                    const config::LoadOptions& options = {});

// The run in `run_dir` on the topology the flags and environment give. When the world size or
// the directory changed, the writer (node 0, or rank 0) rewrites config.resolved.json and says
// so. `max_restarts` >= 0 replaces launch.max_restarts for this launch only.
RunPlan plan_resume(const std::string& run_dir, const LaunchFlags& flags, int max_restarts);

// train --resume: "" starts fresh; "auto" continues run_dir when it holds this same run (same
// config hash) with a committed checkpoint, and starts it when run_dir is new or this run stopped
// before its first checkpoint (another configuration is refused rather than guessed); a PATH (made absolute) starts a new run from another
// run's checkpoint, a step directory or a ckpt/ directory with a committed one, checked before the new run directory is made.
struct ResumeChoice {
  bool resume = false;
  std::string from;  // another run's checkpoint; "" with resume: this run's latest
};
ResumeChoice choose_resume(const config::Recipe& recipe, const std::string& resume_arg);

// The topology from the flags, the environment and the recipe's launch values (nproc_given:
// whether the recipe set nproc_per_node; otherwise the visible GPUs decide).
Topology decide_topology(const LaunchFlags& flags, int recipe_nproc, bool recipe_nproc_given, int recipe_nnodes,
                         const std::string& recipe_master_addr, int recipe_master_port);

// Summary lines of what a run will do (the launcher's first lines).
std::string describe_plan(const config::Recipe& recipe);

}  // namespace dstrain::launch
