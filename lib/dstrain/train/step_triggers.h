#pragma once
// When a step boundary ends with a checkpoint or a stop, as this rank sees it (StepSignals make
// every rank agree):
//   save: rank 0's clock (checkpoint.interval_minutes), SIGUSR1 to any rank, or a file named
//         SAVE_NOW in the run directory (rank 0)
//   stop: SIGTERM/SIGINT to any rank (the launcher forwards its own), or rank 0's clock past
//         launch.max_time_minutes
// and, for every rank alike, the last step and every checkpoint.interval_steps.
#include <chrono>
#include <cstdint>
#include <string>

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::run {
class RunDir;
}

namespace dstrain::train {

struct StepSignals;

class StepTriggers {
 public:
  // SIGUSR1 asks for a checkpoint, SIGTERM/SIGINT for a coordinated stop: the first thing a
  // worker does, so that neither ever kills it.
  static void install_signal_handlers();
  static bool stop_signal_received();  // SIGTERM or SIGINT arrived since the handlers were installed

  StepTriggers(const config::Recipe& recipe, const run::RunDir& run_dir, int rank);
  // This rank's wishes now. save_wanted() consumes a SIGUSR1 or SAVE_NOW request.
  bool save_wanted();
  bool stop_wanted() const;
  // Whether step `done` (1-based) ends with a checkpoint, given every rank's signals.
  bool save_after(int64_t done, const StepSignals& all) const;
  // A checkpoint was just written: the interval clock starts again.
  void saved() { last_save_ = std::chrono::steady_clock::now(); }
  // Why the run stops: "signal", or "wall-time budget of 90 min".
  std::string stop_reason() const;

 private:
  const config::Recipe& recipe_;
  std::string save_now_file_;
  int rank_;
  std::chrono::steady_clock::time_point started_, last_save_;
};

}  // namespace dstrain::train
