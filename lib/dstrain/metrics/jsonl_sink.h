#pragma once
// metrics.jsonl: one JSON object per logged step, appended and flushed by rank 0. On resume the
// lines after the checkpoint's step are dropped first, so the file reads like one run.
#include <cstdint>
#include <fstream>
#include <string>

namespace dstrain::metrics {

struct StepMetrics {
  int64_t step;  // 1-based: optimizer steps completed
  double loss;
  double lr;
  double grad_norm;
  int64_t tokens;  // tokens consumed so far, all ranks
  double step_ms;
  double tokens_per_s;
  double data_wait_ms;  // time the step waited for its batches (prefetched on a background thread)
  double loss_scale = 1;  // fp16: the loss scale this step used (1 otherwise)
  bool skipped = false;   // fp16: the gradients overflowed and the update was skipped
  double comm_wait_ms = 0;  // time the step blocked on gradient/parameter collectives (rank 0)
  int64_t bad_steps = 0;    // NaN/Inf steps so far in this launch (train.on_bad_step)
};

class JsonlSink {
 public:
  // Keeps existing lines with step <= keep_through_step (0 for a new run: starts empty).
  JsonlSink(const std::string& path, int64_t keep_through_step);
  void write(const StepMetrics& m);

 private:
  std::ofstream out_;
};

}  // namespace dstrain::metrics
