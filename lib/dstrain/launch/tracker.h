#pragma once
// The wandb and mlflow sinks: a side process of the launcher on node 0 that follows
// run_dir/metrics.jsonl and logs every metric at its step through the W&B and MLflow Python SDKs
// (tracker.py, built into the binary). Nothing in the training loop waits for it: the workers only
// write metrics.jsonl, as they do without it.
#include <sys/types.h>

#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/run/run_dir.h"

namespace dstrain::launch {

class Tracker {
 public:
  // Starts the side process and waits until each SDK has its run (a resumed run continues the
  // same W&B and MLflow runs). Throws Error{kEnvironment} before any worker starts when the
  // interpreter, an SDK or its run cannot start, with the side process's own last lines.
  Tracker(const config::Recipe& recipe, const run::RunDir& run_dir);
  // Kills a side process still running (finish() was not reached).
  ~Tracker();
  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;

  // The run has ended: writes the report's charts (run_dir/report), lets the side process log
  // what is left and upload them, and waits for it (a failure there is a warning, never the run's).
  void finish();

 private:
  std::string log_path_;
  std::string run_root_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
};

// The interpreter the sinks use: logging.python, else $DSTRAIN_PYTHON, else python3.
std::string tracker_python(const config::Recipe& recipe);

}  // namespace dstrain::launch
