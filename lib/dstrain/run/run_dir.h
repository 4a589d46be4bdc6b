#pragma once
// The layout of a run directory:
//   config.resolved.json   the validated config workers read (hash-checked)
//   logs/rank_XXXXX.log    each rank's output
//   metrics.jsonl          one JSON object per logged step (rank 0)
//   ckpt/step_XXXXXXXX/    checkpoints; ckpt/latest names the newest committed one
#include <string>

#include "dstrain/config/recipe.h"

namespace dstrain::run {

class RunDir {
 public:
  explicit RunDir(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }
  std::string config_path() const { return root_ + "/config.resolved.json"; }
  std::string log_dir() const { return root_ + "/logs"; }
  std::string metrics_path() const { return root_ + "/metrics.jsonl"; }
  std::string ckpt_dir() const { return root_ + "/ckpt"; }
  // checkpoint.dir when the recipe sets one, else ckpt_dir().
  std::string ckpt_dir(const config::Recipe& recipe) const { return recipe.checkpoint.dir.empty() ? ckpt_dir() : recipe.checkpoint.dir; }
  // Creates the directory for a new run and writes config.resolved.json. Refuses a directory
  // that already holds a run (never overwrites checkpoints): resume it or pick another run_dir.
  void prepare_new(const config::Recipe& recipe) const;
  // A resume needs a committed checkpoint (existence only: the workers' rank 0 verifies it and,
  // if it must, falls back to an older one). Throws Error{kCheckpoint}.
  void check_resumable(const config::Recipe& recipe) const;

 private:
  std::string root_;
};

}  // namespace dstrain::run
