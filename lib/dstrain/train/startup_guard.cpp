#include "dstrain/train/startup_guard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/train/step_triggers.h"

namespace dstrain::train {

StartupStopGuard::StartupStopGuard(int rank, std::string waiting_for, std::function<int()> exit_status) {
  watcher_ = std::thread([this, rank, what = std::move(waiting_for), status = std::move(exit_status)] {
    while (armed_.load()) {
      if (StepTriggers::stop_signal_received()) {
        const int code = status();
        log::warn(fmt::format("rank {}: stop requested (SIGTERM/SIGINT) during {}; exiting with status {}{}", rank, what, code,
                              code == exit_status::kStopped ? " (a committed checkpoint exists: `dstrain resume` continues from it)" : ""));
        std::fflush(nullptr);
        ::_exit(code);  // the waits in c10d and Gloo cannot be interrupted any other way
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

StartupStopGuard::~StartupStopGuard() { disarm(); }

void StartupStopGuard::disarm() {
  armed_ = false;
  if (watcher_.joinable()) watcher_.join();
}

int startup_stop_status(const std::string& run_dir) {
  try {
    const run::RunDir dir(run_dir);
    if (!std::filesystem::exists(dir.config_path())) return exit_status::kInterrupted;
    const config::Recipe recipe = config::read_resolved_config(dir.config_path());
    return ckpt::has_committed_checkpoint(dir.ckpt_dir(recipe)) ? exit_status::kStopped : exit_status::kInterrupted;
  } catch (...) {
    return exit_status::kInterrupted;
  }
}

}  // namespace dstrain::train
