#pragma once
// The layout of a run directory:
//   config.resolved.json   the validated config workers read (hash-checked)
//   logs/rank_XXXXX.log    each rank's output
//   metrics.jsonl          one JSON object per logged step (rank 0)
//   ckpt/step_XXXXXXXX/    checkpoints; ckpt/latest names the newest committed one
//   previous-attempts/N/   the files of attempts that ended before their first checkpoint
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
  // whose run has a committed checkpoint (never overwrites checkpoints): resume it or pick
  // another run_dir. A run that ended before its first checkpoint has nothing to resume, so a
  // new run takes its place: that attempt's files move to previous-attempts/N/ (kept, and said).
  void prepare_new(const config::Recipe& recipe) const;
  // The first half of prepare_new, for a node > 0 that receives the config from node 0: refuses a
  // run with a committed checkpoint, moves an unsaved one aside; nothing when there is no run.
  void set_aside_unsaved_run(const config::Recipe& recipe) const;
  // A resume needs a committed checkpoint (existence only: the workers' rank 0 verifies it and,
  // if it must, falls back to an older one). Throws Error{kCheckpoint} whose hint is the
  // `dstrain train` command line that starts the run again.
  void check_resumable(const config::Recipe& recipe) const;
  // Where prepare_new keeps attempt `n` (1-based) of a run that never committed a checkpoint.
  std::string previous_attempt_dir(int n) const { return root_ + "/previous-attempts/" + std::to_string(n); }

 private:
  std::string root_;
};

}  // namespace dstrain::run
