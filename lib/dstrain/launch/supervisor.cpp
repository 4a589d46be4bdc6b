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

#include <nlohmann/json.hpp>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/run/progress_line.h"

extern char** environ;

namespace dstrain::launch {

const char* failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kSignal:
      return "signal";
    case FailureKind::kHang:
      return "hang";
    case FailureKind::kNodeLost:
      return "node_lost";
    case FailureKind::kRemote:
      return "remote";
    case FailureKind::kExit:
      break;
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
  int signalled = 0;  // the last signal the launcher sent it (SIGTERM, SIGKILL), 0: none
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
    const std::optional<run::ProgressLine> p = run::decode_line(line);
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
    text = fmt::format("\r{} {}/{} {:3.0f}% | ETA {}:{:02d}:{:02d} | {:.0f} tok/s | loss {:.4f}", bar, step, total, 100.0 * frac,
                       eta / 3600, (eta / 60) % 60, eta % 60, p->tokens_per_s, p->loss);
    draw();
  }
};
ProgressBar g_bar;

bool is_warning_or_error(const std::string& line) {
  return line.find(" WARN ") != std::string::npos || line.find(" ERROR ") != std::string::npos || line.find("error:") != std::string::npos;
}

void emit_line(Child& c, const std::string& line) {
  if (c.rank == 0 && run::is_progress_line(line)) return g_bar.update(line);
  c.log << line << '\n';
  c.log.flush();
  c.tail.push_back(line);
  if (c.tail.size() > 20) c.tail.pop_front();
  if (c.rank == 0 || is_warning_or_error(line)) {
    const std::string out =
        c.rank == 0 || line.find("[rank ") != std::string::npos ? line + "\n" : fmt::format("[rank {}] {}\n", c.rank, line);
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

pid_t spawn(const SupervisorOptions& o, const run::WorkerEnv& env, int& out_fd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorCode::kEnvironment, fmt::format("pipe failed: {}", std::strerror(errno)), "");
  // Build argv and envp before fork: only async-signal-safe calls in the child.
  std::vector<std::string> args{o.executable};
  args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  run::WorkerEnv with_bar = env;
  with_bar.progress_line = o.progress_bar;
  const auto assigned = run::worker_env_assignments(with_bar);
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& a : assigned) overridden |= a.compare(0, key.size() + 1, key + "=") == 0;
    if (!overridden) env_strings.push_back(kv);
  }
  env_strings.insert(env_strings.end(), assigned.begin(), assigned.end());
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    throw Error(ErrorCode::kEnvironment, fmt::format("fork failed: {}", std::strerror(errno)),
                "the machine may be out of processes or memory");
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
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       sigabbrev_np(WTERMSIG(status)) ? std::string("SIG") + sigabbrev_np(WTERMSIG(status)) : "?");
  return "ended";
}

// Nested scopes (the launch loop's, each supervise()'s) share the outermost one's handlers, so a
// signal during a restart backoff is not lost between two supervise() calls.
int g_signal_scopes = 0;
struct sigaction g_old_int {
}, g_old_term{}, g_old_usr1{};

}  // namespace

SignalScope::SignalScope() {
  if (g_signal_scopes++ > 0) return;
  struct sigaction stop {};
  stop.sa_handler = on_signal;
  sigemptyset(&stop.sa_mask);
  sigaction(SIGINT, &stop, &g_old_int);
  sigaction(SIGTERM, &stop, &g_old_term);
  struct sigaction save {};
  save.sa_handler = on_save_request;
  sigemptyset(&save.sa_mask);
  sigaction(SIGUSR1, &save, &g_old_usr1);
  g_signal = 0;
  g_signal_count = 0;
  g_save_request = 0;
}

SignalScope::~SignalScope() {
  if (--g_signal_scopes > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
}

int SignalScope::stop_signal() { return g_signal; }

namespace {

using Clock = std::chrono::steady_clock;

// One supervise() call: its workers and what has happened to them.
class Group {
 public:
  explicit Group(const SupervisorOptions& o)
      : o_(o), children_(o.workers.size()), next_watch_(Clock::now() + std::chrono::milliseconds(o.watch_period_ms)) {
    for (size_t i = 0; i < o.workers.size(); ++i) {
      Child& c = children_[i];
      c.rank = o.workers[i].rank;
      c.log_path = fmt::format("{}/rank_{:05d}.log", o.log_dir, c.rank);
      c.log.open(c.log_path, std::ios::app);
      c.pid = spawn(o, o.workers[i], c.out_fd);
    }
  }

  // One round: output first (so that a failing worker's last words reach its log), exits, the
  // watchdog, signals. False once every worker has ended and its output is read.
  bool round() {
    pump_output();
    reap();
    watch();
    handle_signals();
    if (std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; })) return true;
    for (auto& c : children_)  // children are gone; take what is still buffered in the pipes
      while (c.out_fd >= 0 && drain(c)) {}
    return false;
  }

  int finish(WorkerFailure* failure) {
    if (g_bar.shown) (void)!::write(STDERR_FILENO, "\n", 1);
    g_bar = ProgressBar{};
    const int status = watched_failure_ ? report_watched(failure) : first_failure_ ? report_failed(failure) : stopped_status();
    write_exit_record(status);
    return status;
  }

 private:
  void signal_all(int sig) {  // SIGKILL, SIGTERM, and SIGUSR1 forwarded
    for (auto& c : children_)
      if (c.running) {
        ::kill(c.pid, sig);
        if (sig != SIGUSR1) c.signalled = sig;
      }
  }

  // How each worker ended, for scripts and tests: a launcher's status says the group failed, this
  // says which process ended how (issue 17: workers that crash at exit after their last step).
  void write_exit_record(int launcher_status) const {
    if (children_.empty()) return;
    nlohmann::json workers = nlohmann::json::array();
    for (const auto& c : children_)
      workers.push_back({{"rank", c.rank},
                         {"pid", c.pid},
                         {"exit_code", WIFEXITED(c.status) ? nlohmann::json(WEXITSTATUS(c.status)) : nlohmann::json(nullptr)},
                         {"signal", WIFSIGNALED(c.status) ? WTERMSIG(c.status) : 0},
                         {"signal_from_launcher", c.signalled},
                         {"description", describe(c.status)}});
    const nlohmann::json record = {
        {"format", "dstrain-worker-exits"},   {"version", 1},      {"host", host_name()}, {"node", o_.workers.front().group_rank},
        {"launcher_status", launcher_status}, {"workers", workers}};
    try {
      write_file_atomic(exit_record_path(o_.log_dir, o_.workers.front().group_rank), record.dump(2) + "\n");
    } catch (const std::exception& e) {
      log::warn(std::string("could not write the workers' exit record: ") + e.what());
    }
  }
  bool quiet() const { return !first_failure_ && !watched_failure_ && !forwarded_signal_; }

  void pump_output() {
    std::vector<pollfd> pfds;
    std::vector<Child*> owners;
    for (auto& c : children_)
      if (c.out_fd >= 0) pfds.push_back({c.out_fd, POLLIN, 0}), owners.push_back(&c);
    if (pfds.empty()) return (void)::usleep(50 * 1000);
    if (::poll(pfds.data(), pfds.size(), 100) > 0)
      for (size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents) drain(*owners[i]);
  }

  void reap() {
    for (auto& c : children_) {
      int status = 0;
      if (!c.running || ::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      // 75: a coordinated stop (a signal, or the wall-time budget) that every rank takes together.
      const bool stopped_as_asked = WIFEXITED(status) && WEXITSTATUS(status) == exit_status::kStopped;
      if (ok || stopped_as_asked || !quiet()) continue;
      // A communication error is usually a symptom: a peer crashed, and the crash may be reaped
      // a moment later. It is the cause only if no other failure follows within the window.
      const bool symptom = WIFEXITED(status) && WEXITSTATUS(status) == exit_status::kComm;
      if (symptom) {
        if (!symptom_) symptom_ = &c, attribution_deadline_ = Clock::now() + kAttributionWindow;
        continue;
      }
      first_failure_ = &c;
      signal_all(SIGKILL);  // the others wait on the dead one in a collective: nothing to save
    }
    const bool all_ended = std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; });
    if (symptom_ && quiet() && (all_ended || Clock::now() >= attribution_deadline_)) {
      first_failure_ = symptom_;
      signal_all(SIGKILL);
    }
  }

  void watch() {
    if (!o_.watchdog || !quiet() || Clock::now() < next_watch_) return;
    next_watch_ = Clock::now() + std::chrono::milliseconds(o_.watch_period_ms);
    if (auto f = o_.watchdog()) {
      watched_failure_ = std::move(f);
      signal_all(SIGKILL);  // SIGKILL also ends a SIGSTOPped process
    }
  }

  void handle_signals() {
    if (g_save_request) {  // SIGUSR1: the workers checkpoint at the end of the current step
      g_save_request = 0;
      log::info("received SIGUSR1; asking the workers for a checkpoint after this step");
      signal_all(SIGUSR1);
    }
    if (g_signal && !forwarded_signal_) {
      forwarded_signal_ = g_signal;
      log::warn(fmt::format("received {}: the workers stop{} ({} s at most; a second signal kills them)",
                            forwarded_signal_ == SIGINT ? "SIGINT" : "SIGTERM",
                            o_.saves_on_stop ? " at the next step boundary after a checkpoint" : "", o_.grace_period_s));
      signal_all(SIGTERM);
      stop_deadline_ = Clock::now() + std::chrono::seconds(o_.grace_period_s);
    } else if (forwarded_signal_ && g_signal_count > 1 && stop_deadline_ != Clock::time_point::min()) {
      log::warn("second signal: killing the workers");
      signal_all(SIGKILL);
      stop_deadline_ = Clock::time_point::min();
    }
    if (stop_deadline_ != Clock::time_point::min() && Clock::now() > stop_deadline_) {
      signal_all(SIGKILL);
      stop_deadline_ = Clock::time_point::max();
    }
  }

  int report_watched(WorkerFailure* failure) {
    log::error(watched_failure_->description + "; the workers on this node were stopped.");
    watched_failure_->happened = true;
    for (const auto& c : children_)  // the blamed rank runs here: its pid and last words
      if (c.rank == watched_failure_->rank) watched_failure_->pid = c.pid, watched_failure_->tail.assign(c.tail.begin(), c.tail.end());
    if (failure) *failure = *watched_failure_;
    return watched_failure_->kind == FailureKind::kHang ? exit_status::kComm : exit_status::kWorkerFailed;
  }

  int report_failed(WorkerFailure* failure) const {
    const Child& c = *first_failure_;
    const std::string host = host_name();
    std::string report =
        fmt::format("rank {} (pid {} on {}) {}; the other workers were stopped.\n", c.rank, c.pid, host, describe(c.status));
    if (c.tail.empty())
      report += fmt::format("its log {} is empty: it wrote nothing before it stopped (ranks other than 0 log only warnings and errors)",
                            c.log_path);
    else
      report += fmt::format("last lines of {}:", c.log_path);
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

  int stopped_status() const {
    auto exited_with = [](const Child& c, int s) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == s; };
    const bool any_stopped =
        std::any_of(children_.begin(), children_.end(), [&](const Child& c) { return exited_with(c, exit_status::kStopped); });
    if (!forwarded_signal_ && !any_stopped) return exit_status::kOk;
    const bool all_stopped = std::all_of(children_.begin(), children_.end(),
                                         [&](const Child& c) { return exited_with(c, exit_status::kStopped) || exited_with(c, 0); });
    return all_stopped ? exit_status::kStopped : exit_status::kInterrupted;
  }

  const SupervisorOptions& o_;
  std::vector<Child> children_;
  const Child* first_failure_ = nullptr;
  static constexpr std::chrono::milliseconds kAttributionWindow{2000};
  const Child* symptom_ = nullptr;  // the first communication error, while the window is open
  Clock::time_point attribution_deadline_;
  std::optional<WorkerFailure> watched_failure_;  // from the watchdog
  Clock::time_point next_watch_;
  int forwarded_signal_ = 0;
  Clock::time_point stop_deadline_ = Clock::time_point::max();
};

}  // namespace

std::string exit_record_path(const std::string& log_dir, int node) {
  return (std::filesystem::path(log_dir) / fmt::format("exits.node{}.json", node)).string();
}

int supervise(const SupervisorOptions& o, WorkerFailure* failure) {
  std::filesystem::create_directories(o.log_dir);
  const SignalScope signals;
  Group group(o);
  while (group.round()) {}
  return group.finish(failure);
}

}  // namespace dstrain::launch
