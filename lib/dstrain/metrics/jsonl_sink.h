#pragma once
// metrics.jsonl: one JSON object per step, appended and flushed by rank 0. On resume the lines
// after the checkpoint's step are dropped first, so the file reads like one run.
#include <cstdint>
#include <fstream>
#include <string>

#include "dstrain/metrics/step_metrics.h"

namespace dstrain::metrics {

class JsonlSink {
 public:
  // Keeps existing lines with step <= keep_through_step (0 for a new run: starts empty).
  JsonlSink(const std::string& path, int64_t keep_through_step);
  void write(const StepMetrics& m);
  void write(const EvalMetrics& m);
  void write(const TaskMetrics& m);

 private:
  std::ofstream out_;
};

// The JSONL line of a step (without the newline), exposed for tests.
std::string jsonl_line(const StepMetrics& m);
// {"step", "time", "eval": NAME, "val_loss", "val_ppl", "val_tokens", "eval_ms"}
std::string jsonl_line(const EvalMetrics& m);
// {"step", "time", "task": NAME, "acc", "acc_norm", "n", "eval_ms"}
std::string jsonl_line(const TaskMetrics& m);

}  // namespace dstrain::metrics
