#pragma once
// The one seam for test-only faults and slowdowns. Production code asks the injector at the
// points where a fault can be injected; every answer is "no fault" unless a test enabled it with
// one environment variable, read once per process:
//   DSTRAIN_TEST_FAULTS="name=value;name=value..."
// Faults (ranks and steps as in the logs: steps 1-based):
//   crash_at_save_point=K   the K-th checkpoint write point ends the process at once (status 99)
//   inf_step=K              step K's gradients get an inf (fp16 overflow handling)
//   nan_loss=R:K[:always]   rank R's loss is NaN at step K: once per process (a transient fault,
//                           which a rollback cures), or every time step K is computed
//   stall=R:K:S             rank R sleeps S seconds in the forward of step K, heartbeat alive
//   slow_rank=R:F           rank R's micro-batches take F times as long (it sleeps the rest)
//   offload_chunk=N         optimizer offload's chunk size in elements
//   fact=R:NAME=VALUE       check-env: rank R reports VALUE for its fact NAME
//   data_path=R:PATH        check-env: rank R checks PATH as the recipe's dataset
//   crash_at_exit=R         rank R dies of SIGSEGV after its last step and shutdown, as the
//                           GPU workers did at exit (issue 17): the launcher must not call it done
// A malformed value is an Error{kUsage} naming it, at the first query.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace dstrain {

class FaultInjector {
 public:
  // This process's injector (DSTRAIN_TEST_FAULTS).
  static FaultInjector& get();
  // An injector for `spec` (the variable's syntax); "" injects nothing.
  explicit FaultInjector(const std::string& spec);

  bool any() const { return any_; }
  // Counts checkpoint write points; ends the process at the configured one.
  void save_point();
  bool overflow_at(int64_t step) const { return step == inf_step_; }
  // Whether rank's loss at `step` is to be NaN (a once-only fault fires once).
  bool nan_loss_due(int rank, int64_t step);
  // Seconds rank sleeps in the forward of `step` (0: none).
  double stall_seconds(int rank, int64_t step) const;
  // How many times slower rank is to be (1: not slowed).
  double slowdown(int rank) const;
  int64_t offload_chunk(int64_t otherwise) const { return offload_chunk_ > 0 ? offload_chunk_ : otherwise; }
  // check-env: (fact name, value) that rank reports instead of its own, and the dataset it checks.
  std::optional<std::pair<std::string, std::string>> fact_override(int rank) const;
  std::string data_path_override(int rank) const;
  bool crash_at_exit(int rank) const { return rank == crash_at_exit_rank_; }

 private:
  struct RankStep {
    int rank = -1;
    int64_t step = -1;
  };
  bool any_ = false;
  long crash_at_ = 0;
  std::atomic<long> save_points_{0};
  int64_t inf_step_ = -1;
  RankStep nan_loss_;
  bool nan_always_ = false;
  std::atomic<bool> nan_fired_{false};
  RankStep stall_;
  double stall_s_ = 0;
  int slow_rank_ = -1;
  double slow_factor_ = 1;
  int64_t offload_chunk_ = 0;
  int crash_at_exit_rank_ = -1;
  int fact_rank_ = -1;
  std::string fact_name_, fact_value_;
  int data_rank_ = -1;
  std::string data_path_;
};

}  // namespace dstrain
