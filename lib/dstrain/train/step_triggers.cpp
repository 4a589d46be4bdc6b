#include "dstrain/train/step_triggers.h"

#include <fmt/format.h>

#include <csignal>
#include <filesystem>

#include "dstrain/config/recipe.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/train/step_signals.h"

namespace dstrain::train {
namespace {

volatile std::sig_atomic_t g_save_requested = 0;
volatile std::sig_atomic_t g_stop_requested = 0;
void on_save_request(int) { g_save_requested = 1; }
void on_stop_request(int) { g_stop_requested = 1; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

void StepTriggers::install_signal_handlers() {
  struct sigaction save {};
  save.sa_handler = on_save_request;
  save.sa_flags = SA_RESTART;  // blocking calls in Gloo resume instead of failing with EINTR
  sigemptyset(&save.sa_mask);
  sigaction(SIGUSR1, &save, nullptr);
  struct sigaction stop {};
  stop.sa_handler = on_stop_request;
  stop.sa_flags = SA_RESTART;
  sigemptyset(&stop.sa_mask);
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
}

bool StepTriggers::stop_signal_received() { return g_stop_requested != 0; }

StepTriggers::StepTriggers(const config::Recipe& recipe, const run::RunDir& run_dir, int rank)
    : recipe_(recipe), save_now_file_(run_dir.root() + "/SAVE_NOW"), rank_(rank), started_(std::chrono::steady_clock::now()),
      last_save_(started_) {}

bool StepTriggers::save_wanted() {
  const double minutes = recipe_.checkpoint.interval_minutes;
  bool due = rank_ == 0 && minutes > 0 && seconds_since(last_save_) >= minutes * 60.0;
  if (g_save_requested) g_save_requested = 0, due = true;
  if (rank_ == 0 && std::filesystem::exists(save_now_file_)) {
    std::filesystem::remove(save_now_file_);
    due = true;
  }
  return due;
}

bool StepTriggers::stop_wanted() const {
  const double budget = recipe_.launch.max_time_minutes;
  return g_stop_requested || (rank_ == 0 && budget > 0 && seconds_since(started_) >= budget * 60.0);
}

bool StepTriggers::save_after(int64_t done, const StepSignals& all) const {
  const int64_t interval = recipe_.checkpoint.interval_steps;
  return (done == recipe_.train.steps && recipe_.checkpoint.at_end) || (interval > 0 && done % interval == 0) || all.save || all.stop;
}

std::string StepTriggers::stop_reason() const {
  return g_stop_requested ? "signal" : fmt::format("wall-time budget of {:g} min", recipe_.launch.max_time_minutes);
}

}  // namespace dstrain::train
