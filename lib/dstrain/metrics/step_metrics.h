#pragma once
// One optimizer step's metrics, as rank 0 records them, and the sinks that take them: JSONL
// (run_dir/metrics.jsonl), CSV (one file per metric, DeepSpeed csv_monitor style) and
// TensorBoard event files. Every numeric field is a scalar; NaN means "not applicable here"
// (JSONL writes null, CSV and TensorBoard skip it). The JSONL keys are documented in README.md.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::metrics {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

// A metric the step's objective names (model/objective.h): one value, or one per term (mtp_loss:
// one per depth). Each is a term's sum over the targets it covered, all ranks.
struct ObjectiveMetric {
  std::string name;
  std::vector<double> values;
};

struct StepMetrics {
  int64_t step = 0;      // 1-based: optimizer steps completed
  double wall_time = 0;  // unix seconds
  double loss = kNone;
  // The objective's terms (mtp_loss: each MTP depth's cross-entropy over its own targets; z_loss),
  // right after the loss. JSONL: a number for one value, a list for more; TensorBoard and CSV:
  // the name, or name_1, name_2, ...
  std::vector<ObjectiveMetric> objective;
  double lr = kNone;
  double grad_norm = kNone;
  double loss_scale = 1;     // fp16: the scale this step used (1 otherwise)
  bool skipped = false;      // the update was skipped (fp16 overflow or a bad step)
  int64_t bad_steps = 0;     // NaN/Inf steps so far in this launch (train.on_bad_step)
  int64_t tokens = 0;        // tokens consumed so far, all ranks
  double epoch = kNone;      // fine-tuning sets: passes over the packed rows so far (1.5: halfway through the second)
  int64_t accumulation = 0;  // micro-steps per rank in this step
  double step_ms = kNone;
  double tokens_per_s = kNone;
  double samples_per_s = kNone;
  double tflops_per_rank = kNone;  // model FLOPs (6N + attention, no causal discount) per second per rank
  double mfu = kNone;              // tflops_per_rank / peak_tflops
  double peak_tflops = kNone;      // the per-rank peak MFU is measured against (see the log for its source)
  double data_wait_ms = kNone;     // waiting for the step's batches (prefetched on a thread)
  double comm_wait_ms = kNone;     // blocked on gradient/parameter collectives
  double host_rss_mb = kNone;      // rank 0's resident memory now
  double host_peak_rss_mb = kNone;
  double device_alloc_peak_mb = kNone;  // CUDA caching allocator peaks (GPU runs)
  double device_reserved_peak_mb = kNone;
  double expert_imbalance = kNone;  // MoE: the busiest expert's load over the mean (1 = balanced)
  double all_to_all_ms = kNone;     // expert parallelism: blocked on the token all-to-alls (what overlap did not hide)
  // Pipeline parallelism: every rank's time in the schedule not computing (waiting for its
  // neighbours: the bubble, the transfers, any imbalance between stages) over its compute time,
  // summed over the ranks: the papers' bubble, (p - 1) / m for 1F1B.
  double pipeline_bubble = kNone;
  // wall_clock_breakdown: rank 0's step split into phases (collective waits may fall inside
  // forward/backward when overlapped).
  double forward_ms = kNone;
  double backward_ms = kNone;
  double issue_ms = kNone;   // GPU: host time spent issuing forward and backward; near forward + backward: launch-bound
  double reduce_ms = kNone;  // blocked on gradient reductions
  double gather_ms = kNone;  // blocked on parameter all-gathers
  double optimizer_ms = kNone;
  double checkpoint_ms = kNone;  // saves since the previous line (a step's line precedes its save)
  std::vector<int> stragglers;   // ranks found slow at this step's straggler check
};

// One evaluation set's result at a step (a metrics.jsonl row of its own, without "loss").
struct EvalMetrics {
  int64_t step = 0;  // optimizer steps completed when evaluated (0: before the first)
  double wall_time = 0;
  std::string name;  // the set
  double val_loss = kNone, val_ppl = kNone;
  int64_t val_tokens = 0;
  double eval_ms = kNone;
  // A set of preference pairs: how many, and the objective's metrics on them (rewards/accuracies,
  // ...: TRL's names); val_ppl and val_tokens do not apply.
  int64_t pairs = 0;
  std::vector<std::pair<std::string, double>> metrics;
};

// One task's score at a step (eval.tasks; a metrics.jsonl row of its own): acc and acc_norm of a
// multiple-choice task, exact_match (and exact_match_flexible: gsm8k) of a generative one.
struct TaskMetrics {
  int64_t step = 0;
  double wall_time = 0;
  std::string name;  // the task (its file stem)
  double acc = kNone, acc_norm = kNone, exact_match = kNone, exact_match_flexible = kNone;
  int64_t questions = 0;
  double eval_ms = kNone;
};

// (name, value) of every numeric field, in the documented order (booleans as 0/1).
std::vector<std::pair<std::string, double>> scalar_fields(const StepMetrics& m);

}  // namespace dstrain::metrics
