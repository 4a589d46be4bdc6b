#include "dstrain/launch/tracker.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/report/run_report.h"

namespace dstrain::launch {
extern const char* const kTrackerScript;  // tracker.py (generated tracker_script.cpp)

namespace {
namespace fs = std::filesystem;

constexpr auto kStartTimeout = std::chrono::seconds(180);   // an SDK logging in over a slow network
constexpr auto kFinishTimeout = std::chrono::seconds(300);  // uploading what is left and the charts

std::string spec_json(const config::Recipe& recipe, const run::RunDir& run_dir) {
  const auto& l = recipe.logging;
  nlohmann::json spec = {
      {"run_dir", run_dir.root()},
      {"metrics", run_dir.metrics_path()},
      {"config", run_dir.config_path()},
      {"state", run_dir.root() + "/tracker.json"},
      {"report_dir", run_dir.root() + "/report"},
      {"name", l.run_name.empty() ? fs::path(run_dir.root()).filename().string() : l.run_name},
      {"sinks", nlohmann::json::array()},
      {"wandb", {{"project", l.wandb_project}, {"entity", l.wandb_entity}, {"group", l.wandb_group}}},
      {"mlflow", {{"experiment", l.mlflow_experiment}}},
  };
  for (const config::Sink s : {config::Sink::kWandb, config::Sink::kMlflow})
    if (l.has_sink(s)) spec["sinks"].push_back(config::name(s));
  return spec.dump();
}

std::string sink_names(const config::Recipe& recipe) {
  std::vector<std::string> names;
  for (const config::Sink s : {config::Sink::kWandb, config::Sink::kMlflow})
    if (recipe.logging.has_sink(s)) names.push_back(config::name(s));
  return fmt::format("{}", fmt::join(names, " and "));
}

std::vector<std::string> last_lines(const std::string& path, size_t count) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    lines.push_back(line);
    if (lines.size() > count) lines.pop_front();
  }
  return {lines.begin(), lines.end()};
}

// Waits for the child's exit, up to `limit`; true when it exited (status in *status).
bool wait_for_exit(pid_t pid, std::chrono::seconds limit, int* status) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t got = ::waitpid(pid, status, WNOHANG);
    if (got == pid || (got < 0 && errno != EINTR)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Reads the child's stdout until "ready\n", its end, or the timeout.
bool await_ready(int fd) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (got.find("ready\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[256];
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r <= 0) return false;  // exited before it was ready
    got.append(buf, static_cast<size_t>(r));
  }
  return true;
}

}  // namespace

std::string tracker_python(const config::Recipe& recipe) {
  if (!recipe.logging.python.empty()) return recipe.logging.python;
  const char* env = std::getenv("DSTRAIN_PYTHON");
  return env && *env ? env : "python3";
}

Tracker::Tracker(const config::Recipe& recipe, const run::RunDir& run_dir)
    : log_path_(run_dir.log_dir() + "/tracker.log"), run_root_(run_dir.root()) {
  const std::string python = tracker_python(recipe);
  const std::string spec = spec_json(recipe, run_dir);
  fs::create_directories(run_dir.log_dir());
  const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (log_fd < 0 || ::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    const int error = errno;
    for (const int fd : {log_fd, in[0], in[1], out[0], out[1]})  // whatever opened before the failure
      if (fd >= 0) ::close(fd);
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot start the {} side process: {}", sink_names(recipe), std::strerror(error)),
                "check that " + run_dir.log_dir() + " is writable");
  }
  std::vector<std::string> args = {python, "-c", kTrackerScript, spec};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    // The run's stop signals are the launcher's to handle: the side process ends when its stdin does.
    for (const int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) std::signal(s, SIG_IGN);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execvp(argv[0], argv.data());
    const std::string msg = fmt::format("dstrain: cannot run '{}': {}\n", python, std::strerror(errno));
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(log_fd);
  stdin_fd_ = in[1];
  const bool ready = pid_ > 0 && await_ready(out[0]);
  ::close(out[0]);
  if (ready) {
    log::info(fmt::format("metrics go to {} too, through {} (a side process; its log: {})", sink_names(recipe), python, log_path_));
    return;
  }
  ::close(stdin_fd_);
  stdin_fd_ = -1;
  int status = 0;
  if (pid_ > 0 && !wait_for_exit(pid_, std::chrono::seconds(5), &status)) ::kill(pid_, SIGKILL), ::waitpid(pid_, &status, 0);
  pid_ = -1;
  const auto tail = last_lines(log_path_, 6);
  const std::string said = tail.empty() ? "" : fmt::format(":\n    {}", fmt::join(tail, "\n    "));
  std::string hint = fmt::format("see {}; logging.python (or $DSTRAIN_PYTHON) names the interpreter", log_path_);
  for (const char* sdk : {"wandb", "mlflow"})
    for (const auto& line : tail)
      if (line.find(fmt::format("No module named '{}'", sdk)) != std::string::npos)
        hint = fmt::format("install it where the sinks run: {} -m pip install {}, or set logging.python to an interpreter that has it",
                           python, std::string(sdk) == "mlflow" ? "mlflow-skinny (or mlflow)" : sdk);
  throw Error(ErrorCode::kEnvironment,
              fmt::format("logging.sinks: the {} side process ({}) did not start{}", sink_names(recipe), python, said), hint);
}

Tracker::~Tracker() {
  if (pid_ <= 0) return;
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  int status = 0;
  if (!wait_for_exit(pid_, std::chrono::seconds(30), &status)) ::kill(pid_, SIGKILL), ::waitpid(pid_, &status, 0);
}

void Tracker::finish() {
  if (pid_ <= 0) return;
  if (fs::is_regular_file(run_root_ + "/metrics.jsonl")) {
    try {
      (void)report::write_run_report(run_root_, run_root_ + "/report");
    } catch (const std::exception& e) {
      log::warn(fmt::format("the run's report (its charts for W&B/MLflow) could not be written: {}", e.what()));
    }
  }
  ::close(stdin_fd_);
  stdin_fd_ = -1;
  int status = 0;
  const pid_t pid = pid_;
  pid_ = -1;
  if (!wait_for_exit(pid, kFinishTimeout, &status)) {
    ::kill(pid, SIGKILL), ::waitpid(pid, &status, 0);
    log::warn(
        fmt::format("the W&B/MLflow side process did not finish within {} s and was stopped; see {}", kFinishTimeout.count(), log_path_));
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const auto tail = last_lines(log_path_, 3);
    log::warn(fmt::format("the W&B/MLflow side process failed (the run itself is unaffected; metrics.jsonl has every step): {}; see {}",
                          tail.empty() ? "no output" : tail.back(), log_path_));
  }
}

}  // namespace dstrain::launch
