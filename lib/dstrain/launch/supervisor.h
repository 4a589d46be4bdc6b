#pragma once
// Starts the local workers (the same binary, hidden `worker` subcommand) and watches them:
// each rank's output goes to run_dir/logs/rank_XXXXX.log; the console shows rank 0's lines and
// warnings/errors of every rank. When a worker fails, the others are killed (the group is broken:
// nothing left to save) and the first failure is reported with the tail of its log. A SIGINT or
// SIGTERM to the launcher is forwarded as SIGTERM: the workers stop together at the next step
// boundary after a checkpoint (exit 75); after the grace period, or at a second signal, whatever
// is left is killed. SIGUSR1 is forwarded (a checkpoint on demand). Workers die with the
// launcher (PR_SET_PDEATHSIG).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/run/worker_env.h"

namespace dstrain::launch {

// What failed: a local worker that exited or was killed by a signal, a hang (HangWatch), a
// launcher that went silent (node lost), or another node's worker, reported by its launcher.
enum class FailureKind { kExit, kSignal, kHang, kNodeLost, kRemote };
// "exit", "signal", "hang", "node_lost", "remote": failures.jsonl and the nodes' reports.
const char* failure_kind_name(FailureKind kind);
bool parse_failure_kind(const std::string& name, FailureKind& out);

// The first worker failure of a supervise() call, for restarts and failures.jsonl.
struct WorkerFailure {
  bool happened = false;
  FailureKind kind = FailureKind::kExit;
  int rank = -1;
  int node = 0;  // the node whose launcher saw it
  int pid = -1;
  std::string host;
  int exit_code = -1;             // when it exited
  int signal = 0;                 // when a signal killed it
  std::string description;        // "was killed by signal 9 (SIGKILL)"
  std::vector<std::string> tail;  // the last lines of its log
  double unix_time = 0;           // when the launcher saw it
};

struct SupervisorOptions {
  std::string executable;                // path of the dstrain binary
  std::vector<std::string> worker_args;  // e.g. {"worker"}
  std::vector<run::WorkerEnv> workers;   // one per local rank
  std::string log_dir;
  int grace_period_s = 60;    // after a forwarded SIGTERM: time to save and exit before SIGKILL
  bool saves_on_stop = true;  // training: a forwarded SIGTERM ends with a checkpoint (eval, check-env: no)
  // Called every `watch_period_ms` while workers run. A failure it returns (a hang, a lost node,
  // another node's failure) ends the group like a local worker failure: every worker is killed.
  std::function<std::optional<WorkerFailure>()> watchdog;
  int watch_period_ms = 500;
  // Rank 0's progress lines drawn as a bar on stderr (set when stderr is a terminal).
  bool progress_bar = false;
};

// Returns the launcher's exit status: kOk; the first failed worker's own status when it is a
// dstrain error status (2-6, 8); kWorkerFailed for crashes, signals and other statuses;
// kInterrupted; kComm after a hang the watchdog found. `failure` (optional) receives the first failure.
// The launcher's handlers (SIGINT/SIGTERM: a coordinated stop, SIGUSR1: a checkpoint) while one
// lives; the previous handlers come back after the outermost. The launch loop holds one across
// its restart generations and backoffs, supervise() one around each generation.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  // SIGINT or SIGTERM when one has arrived (0: none).
  static int stop_signal();
};

// Before returning, writes LOG_DIR/exits.nodeN.json (exit_record_path): how each worker ended
// (exit code or signal, and any signal the launcher sent it) and the launcher's status.
int supervise(const SupervisorOptions& options, WorkerFailure* failure = nullptr);
std::string exit_record_path(const std::string& log_dir, int node);

}  // namespace dstrain::launch
