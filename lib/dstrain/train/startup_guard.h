#pragma once
// A stop request (SIGTERM, SIGINT) while a rank is still starting: in the rendezvous, connecting
// to the store, waiting for rank 0 to prepare the run directory, or in the collectives before the
// first step. Those waits block in c10d and Gloo and do not look at the signal flag, so without
// this guard a rank whose peers never come would outlive its job until launch.timeout_s (issue 25).
// While a guard is armed, a watcher thread sees the flag within 20 ms and ends the process with
// the status `exit_status()` gives (75 when the run has a committed checkpoint to resume from,
// else 130). Once training starts the loop stops at a step boundary instead: disarm first.
#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace dstrain::train {

class StartupStopGuard {
 public:
  // `waiting_for`: what the rank is doing, for the message ("the rendezvous with the other ranks").
  StartupStopGuard(int rank, std::string waiting_for, std::function<int()> exit_status);
  ~StartupStopGuard();
  StartupStopGuard(const StartupStopGuard&) = delete;
  StartupStopGuard& operator=(const StartupStopGuard&) = delete;
  void disarm();

 private:
  std::atomic<bool> armed_{true};
  std::thread watcher_;
};

// 75 when `run_dir` holds a committed checkpoint of its recipe (the job can be resumed), else 130.
int startup_stop_status(const std::string& run_dir);

}  // namespace dstrain::train
