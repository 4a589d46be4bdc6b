#include "dstrain/launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/core/progress_line.h"

extern char** environ;

namespace dstrain::launch {

const char* failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kSignal: return "signal";
    case FailureKind::kHang: return "hang";
    case FailureKind::kNodeLost: return "node_lost";
    case FailureKind::kRemote: return "remote";
    case FailureKind::kExit: break;
  }
  return "exit";
}

bool parse_failure_kind(const std::string& name, FailureKind& out) {
  for (FailureKind k : {FailureKind::kExit, FailureKind::kSignal, FailureKind::kHang, FailureKind::kNodeLost, FailureKind::kRemote})
    if (name == failure_kind_name(k)) return out = k, true;
  return false;
}
namespace {

volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_signal_count = 0;
void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
}
volatile std::sig_atomic_t g_save_request = 0;
void on_save_request(int) { g_save_request = 1; }

struct Child {
  int rank;
  pid_t pid = -1;
  int out_fd = -1;  // read end of the worker's stdout+stderr
  std::string pending;
  std::ofstream log;
  std::string log_path;
  std::deque<std::string> tail;  // last lines, for the failure report
  bool running = true;
  int status = 0;
};

// The progress bar: rank 0's "@@progress step first total loss tokens_per_s elapsed_s" lines,
// drawn on the launcher's terminal (only when it is one) and never written to the logs.
struct ProgressBar {
  bool shown = false;
  std::string text;
  void clear() {
    if (shown) (void)!::write(STDERR_FILENO, "\r\033[K", 4);
  }
  void draw() {
    if (!text.empty()) (void)!::write(STDERR_FILENO, text.data(), text.size()), shown = true;
  }
  void update(const std::string& line) {
    const std::optional<progress::ProgressLine> p = progress::decode_line(line);
    if (!p) return;
    const int64_t step = p->step, first = p->first_step, total = p->total_steps;
    const double elapsed = p->elapsed_s;
    const double frac = static_cast<double>(step) / static_cast<double>(total);
    const int width = 24, filled = static_cast<int>(frac * width);
    std::string bar;
    for (int i = 0; i < width; ++i) bar += i < filled ? "\u2588" : "\u2591";
    const double per_step = step > first ? elapsed / static_cast<double>(step - first) : 0.0;
    const long long eta = static_cast<long long>(per_step * static_cast<double>(total - step));
    clear();
    text = fmt::format("\r{} {}/{} {:3.0f}% | ETA {}:{:02d}:{:02d} | {:.0f} tok/s | loss {:.4f}", bar, step, total, 100.0 * frac, eta / 3600,
                       (eta / 60) % 60, eta % 60, p->tokens_per_s, p->loss);
    draw();
  }
};
ProgressBar g_bar;

bool is_warning_or_error(const std::string& line) {
  return line.find(" WARN ") != std::string::npos || line.find(" ERROR ") != std::string::npos ||
         line.find("error:") != std::string::npos;
}

void emit_line(Child& c, const std::string& line) {
  if (c.rank == 0 && progress::is_progress_line(line)) return g_bar.update(line);
  c.log << line << '\n';
  c.log.flush();
  c.tail.push_back(line);
  if (c.tail.size() > 20) c.tail.pop_front();
  if (c.rank == 0 || is_warning_or_error(line)) {
    const std::string out = c.rank == 0 || line.find("[rank ") != std::string::npos ? line + "\n" : fmt::format("[rank {}] {}\n", c.rank, line);
    g_bar.clear();  // log lines scroll above the bar
    (void)!::write(STDERR_FILENO, out.data(), out.size());
    g_bar.draw();
  }
}

// Reads what is available; returns false on EOF.
bool drain(Child& c) {
  char buf[65536];
  const ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!c.pending.empty()) emit_line(c, c.pending), c.pending.clear();
    ::close(c.out_fd);
    c.out_fd = -1;
    return false;
  }
  c.pending.append(buf, static_cast<size_t>(n));
  size_t start = 0, nl;
  while ((nl = c.pending.find('\n', start)) != std::string::npos) {
    emit_line(c, c.pending.substr(start, nl - start));
    start = nl + 1;
  }
  c.pending.erase(0, start);
  return true;
}

pid_t spawn(const SupervisorOptions& o, const WorkerEnv& env, int& out_fd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorCode::kEnvironment, fmt::format("pipe failed: {}", std::strerror(errno)), "");
  // Build argv and envp before fork: only async-signal-safe calls in the child.
  std::vector<std::string> args{o.executable};
  args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  const auto assigned = worker_env_assignments(env);
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& a : assigned) overridden |= a.compare(0, key.size() + 1, key + "=") == 0;
    if (!overridden) env_strings.push_back(kv);
  }
  env_strings.insert(env_strings.end(), assigned.begin(), assigned.end());
  env_strings.push_back(o.progress_bar ? "DSTRAIN_PROGRESS=1" : "DSTRAIN_PROGRESS=0");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(ErrorCode::kEnvironment, fmt::format("fork failed: {}", std::strerror(errno)), "the machine may be out of processes or memory");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "dstrain launcher: exec of the worker failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(fds[1]);
  out_fd = fds[0];
  return pid;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), sigabbrev_np(WTERMSIG(status)) ? std::string("SIG") + sigabbrev_np(WTERMSIG(status)) : "?");
  return "ended";
}

}  // namespace

int supervise(const SupervisorOptions& o, WorkerFailure* failure) {
  std::filesystem::create_directories(o.log_dir);
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int{}, old_term{}, old_usr1{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct sigaction usr1{};
  usr1.sa_handler = on_save_request;
  sigemptyset(&usr1.sa_mask);
  sigaction(SIGUSR1, &usr1, &old_usr1);
  g_signal = 0;
  g_signal_count = 0;
  g_save_request = 0;

  std::vector<Child> children(o.workers.size());
  for (size_t i = 0; i < o.workers.size(); ++i) {
    Child& c = children[i];
    c.rank = o.workers[i].rank;
    c.log_path = fmt::format("{}/rank_{:05d}.log", o.log_dir, c.rank);
    c.log.open(c.log_path, std::ios::app);
    c.pid = spawn(o, o.workers[i], c.out_fd);
  }

  const Child* first_failure = nullptr;
  std::optional<WorkerFailure> watched_failure;  // from the watchdog
  auto next_watch = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.watch_period_ms);
  int forwarded_signal = 0;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&](int sig) {  // also forwards SIGUSR1
    for (auto& c : children)
      if (c.running) ::kill(c.pid, sig);
  };

  for (;;) {
    // Output first, so that a failing worker's last words reach its log.
    std::vector<pollfd> pfds;
    std::vector<Child*> owners;
    for (auto& c : children)
      if (c.out_fd >= 0) pfds.push_back({c.out_fd, POLLIN, 0}), owners.push_back(&c);
    if (!pfds.empty()) {
      if (::poll(pfds.data(), pfds.size(), 100) > 0)
        for (size_t i = 0; i < pfds.size(); ++i)
          if (pfds[i].revents) drain(*owners[i]);
    } else {
      ::usleep(50 * 1000);
    }

    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      // 75: a coordinated stop (a signal, or the wall-time budget) that every rank takes together.
      const bool stopped_as_asked = WIFEXITED(status) && WEXITSTATUS(status) == exit_status::kStopped;
      if (!ok && !stopped_as_asked && !first_failure && !watched_failure && !forwarded_signal) {
        first_failure = &c;
        stop_all(SIGKILL);  // the others wait on the dead one in a collective: nothing to save
      }
    }
    if (o.watchdog && !first_failure && !watched_failure && !forwarded_signal && std::chrono::steady_clock::now() >= next_watch) {
      next_watch = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.watch_period_ms);
      if (auto f = o.watchdog()) {
        watched_failure = std::move(f);
        stop_all(SIGKILL);  // SIGKILL also ends a SIGSTOPped process
      }
    }
    if (g_save_request) {  // SIGUSR1: the workers checkpoint at the end of the current step
      g_save_request = 0;
      log::info("received SIGUSR1; asking the workers for a checkpoint after this step");
      stop_all(SIGUSR1);
    }
    if (g_signal && !forwarded_signal) {
      forwarded_signal = g_signal;
      log::warn(fmt::format("received {}: the workers stop at the next step boundary after a checkpoint ({} s at most; a second signal kills them)",
                            forwarded_signal == SIGINT ? "SIGINT" : "SIGTERM", o.grace_period_s));
      stop_all(SIGTERM);
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.grace_period_s);
    } else if (forwarded_signal && g_signal_count > 1 && stop_deadline != std::chrono::steady_clock::time_point::min()) {
      log::warn("second signal: killing the workers");
      stop_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::min();
    }
    if (stop_deadline != std::chrono::steady_clock::time_point::min() && std::chrono::steady_clock::now() > stop_deadline) {
      stop_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    bool any_running = false, any_output = false;
    for (auto& c : children) any_running |= c.running, any_output |= c.out_fd >= 0;
    if (!any_running) {
      // Children are gone; take what is still buffered in the pipes, then stop.
      for (auto& c : children)
        while (c.out_fd >= 0 && drain(c)) {
        }
      break;
    }
    (void)any_output;
  }
  if (g_bar.shown) (void)!::write(STDERR_FILENO, "\n", 1);
  g_bar = ProgressBar{};
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGUSR1, &old_usr1, nullptr);

  if (watched_failure) {
    log::error(watched_failure->description + "; the workers on this node were stopped.");
    watched_failure->happened = true;
    for (const auto& c : children)  // the blamed rank runs here: its pid and last words
      if (c.rank == watched_failure->rank) watched_failure->pid = c.pid, watched_failure->tail.assign(c.tail.begin(), c.tail.end());
    if (failure) *failure = *watched_failure;
    return watched_failure->kind == FailureKind::kHang ? exit_status::kComm : exit_status::kWorkerFailed;
  }
  if (first_failure) {
    const Child& c = *first_failure;
    const std::string host = host_name();
    std::string report = fmt::format("rank {} (pid {} on {}) {}; the other workers were stopped.\nlast lines of {}:", c.rank, c.pid, host,
                                     describe(c.status), c.log_path);
    for (const auto& line : c.tail) report += "\n    " + line;
    log::error(report);
    if (failure) {
      failure->happened = true;
      failure->rank = c.rank;
      failure->pid = c.pid;
      failure->host = host;
      failure->exit_code = WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -1;
      failure->signal = WIFSIGNALED(c.status) ? WTERMSIG(c.status) : 0;
      failure->kind = failure->signal ? FailureKind::kSignal : FailureKind::kExit;
      failure->description = describe(c.status);
      failure->tail.assign(c.tail.begin(), c.tail.end());
      failure->unix_time = unix_seconds();
    }
    // A worker that stopped on a dstrain error (bad data, checkpoint, ...) passes its documented
    // status through, so scripts see the cause; crashes and signals are "a worker failed".
    if (WIFEXITED(c.status)) {
      const int s = WEXITSTATUS(c.status);
      if ((s >= exit_status::kUsage && s <= exit_status::kComm) || s == exit_status::kDiverged) return s;
    }
    return exit_status::kWorkerFailed;
  }
  const bool any_stopped = std::any_of(children.begin(), children.end(),
                                       [](const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == exit_status::kStopped; });
  if (forwarded_signal || any_stopped) {
    const bool all_stopped = std::all_of(children.begin(), children.end(), [](const Child& c) {
      return WIFEXITED(c.status) && (WEXITSTATUS(c.status) == exit_status::kStopped || WEXITSTATUS(c.status) == 0);
    });
    return all_stopped ? exit_status::kStopped : exit_status::kInterrupted;
  }
  return exit_status::kOk;
}

}  // namespace dstrain::launch
