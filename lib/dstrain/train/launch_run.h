#pragma once
// The launcher side of `dstrain train` and `dstrain resume`: prepare the run directory, host the
// rendezvous store, start and supervise the local workers.
#include <string>

#include "dstrain/config/recipe.h"

namespace dstrain::train {

struct LaunchOptions {
  std::string executable;  // this binary, re-executed as `dstrain worker`
  bool resume = false;     // continue from run_dir/ckpt/latest
};

// Returns the launcher's exit status.
int launch_run(const config::Recipe& recipe, const LaunchOptions& options);

// Summary lines of what a run will do (the launcher's first lines).
std::string describe_plan(const config::Recipe& recipe);

}  // namespace dstrain::train
