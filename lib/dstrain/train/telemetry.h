#pragma once
// The trainer's metrics for each step: rank 0 assembles them (throughput, MFU, memory, MoE
// balance, the wall-clock breakdown), writes them to the sinks (metrics/sinks.h), prints the
// console line and, when the launcher's terminal is a TTY, a progress line it draws as a bar.
// Every logging.straggler_interval steps all ranks' compute and wait times travel in the step's
// all-reduce (straggler_sample, StepSums) and rank 0 reports the slow ones (log, metrics,
// run_dir/stragglers.jsonl).
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/metrics/step_metrics.h"
#include "dstrain/train/samples.h"
#include "dstrain/device/training_device.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::metrics {
class MetricSinks;
}
namespace dstrain::zero {
class Engine;
}

namespace dstrain::run {
class RunDir;
}

namespace dstrain::train {

// What the loop knows at the end of a step.
struct StepOutcome {
  int64_t step = 0;  // 1-based, done
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool skipped = false;
  int64_t bad_steps = 0;
  int64_t cursor = 0;                                       // samples consumed after this step
  double epoch = std::numeric_limits<double>::quiet_NaN();  // fine-tuning sets: cursor / packed rows
  int64_t global_batch = 0;
  int64_t accumulation = 0;
  double step_ms = 0, data_wait_ms = 0, comm_wait_ms = 0, reduce_ms = 0, gather_ms = 0, optimizer_ms = 0, checkpoint_ms = 0;
  at::Tensor expert_load;                                           // global, [layers, experts] (MoE), else undefined
  double all_to_all_ms = std::numeric_limits<double>::quiet_NaN();  // expert parallelism: blocked on token exchanges
  // Pipeline parallelism: the schedule's time the ranks did not compute over the time they did (all ranks).
  double pipeline_bubble = std::numeric_limits<double>::quiet_NaN();
  std::vector<metrics::ObjectiveMetric> objective;  // the objective's terms by name (mtp_loss: per depth; z_loss), all ranks
  // On straggler steps: every rank's (compute ms, wait ms) per step, rank-major; else empty.
  std::vector<double> straggler_times;
};

class Telemetry {
 public:
  // `progress_line`: rank 0 prints run::ProgressLine for the launcher's bar (WorkerEnv::progress_line).
  Telemetry(const config::Recipe& recipe, const run::RunDir& run_dir, comm::Communicator& comm, int64_t start_step, int threads,
            const device::TrainingDevice& device = {}, bool progress_line = false);
  ~Telemetry();
  // A rollback or resume at `step`: the sinks drop what came after it.
  void restart_at(int64_t step);
  // Phase timers of this rank's current step (forward/backward sums over micro-batches).
  void add_forward(double ms) { forward_ms_ += ms; }
  void add_backward(double ms) { backward_ms_ += ms; }
  // GPU with wall_clock_breakdown: host time issuing a micro-batch's work (before waiting for it).
  void add_issue(double ms) { issue_ms_ = (std::isnan(issue_ms_) ? 0 : issue_ms_) + ms; }
  // Whether step `step` (1-based) ends a straggler interval; then the loop sends
  // straggler_sample() of every rank in the step's all-reduce and passes the result in
  // StepOutcome::straggler_times. Call before finish_step.
  bool stragglers_due(int64_t step) const;
  // This rank's per-step means over the interval: compute (forward + backward, this step's
  // included) and time blocked in collectives (the steps whose waits are known: up to the last).
  std::vector<double> straggler_sample() const;
  void finish_step(const StepOutcome& outcome);
  // An evaluation's results (rank 0 writes them to the sinks and prints one line per set;
  // `note`, if any, ends the first set's line: the best so far, early stopping).
  void record_eval(const std::vector<metrics::EvalMetrics>& results, const std::string& note);
  // eval.tasks' scores (rank 0 writes them and logs a line each).
  void record_tasks(const std::vector<metrics::TaskMetrics>& scores);
  // eval.samples' texts at `step`: rank 0 appends them to run_dir/samples.jsonl ({"step", "index",
  // "prompt", "text", "finish_reason", "tokens"}) and TensorBoard's text tab (samples/INDEX).
  void record_samples(int64_t step, const std::vector<Sample>& samples);

 private:
  void check_stragglers(int64_t step, metrics::StepMetrics& m, const std::vector<double>& times);
  const config::Recipe& recipe_;
  const run::RunDir& run_dir_;
  comm::Communicator& comm_;
  std::unique_ptr<metrics::MetricSinks> sinks_;
  double flops_per_token_ = 0;
  double peak_tflops_ = 0;
  double host_peak_rss_mb_ = 0;  // the highest resident size seen (getrusage's peak lags /proc's current value)
  c10::Device device_ = c10::Device(c10::kCPU);
  double forward_ms_ = 0, backward_ms_ = 0;
  double issue_ms_ = metrics::kNone;                       // not measured (CPU runs): null in the metrics
  double interval_compute_ms_ = 0, interval_wait_ms_ = 0;  // since the last straggler check
  int64_t interval_steps_ = 0, interval_wait_steps_ = 0;
  int64_t first_step_ = 0;
  std::vector<std::string> hosts_;  // by rank, for straggler reports
  bool console_ = true, progress_ = false;
  std::chrono::steady_clock::time_point started_;
};

// run_dir/memory.json: this rank's bytes of model state next to the ZeRO formulas (rank 0 writes it).
void write_memory_report(const run::RunDir& run_dir, const zero::Engine& engine);

// Resident memory of this process now and at its peak, MiB.
double resident_mb();
double peak_resident_mb();

}  // namespace dstrain::train
