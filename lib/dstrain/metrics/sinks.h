#pragma once
// Rank 0's metric sinks, chosen by logging.sinks: jsonl (metrics.jsonl), csv (one file per
// metric: <csv_dir>/<name>.csv with "step,value" rows, as DeepSpeed's csv_monitor), tensorboard
// (event files under <tensorboard_dir>, tags "train/<name>"; evaluations "val/<set>/loss"). Each write is flushed, so a crash
// loses at most the step being written. The console line is the trainer's.
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "dstrain/metrics/step_metrics.h"

namespace dstrain::metrics {

class JsonlSink;
class TensorBoardWriter;

struct SinkOptions {
  std::string jsonl_path;         // "" = off
  std::string csv_dir;            // "" = off
  std::string tensorboard_dir;    // "" = off
  int64_t keep_through_step = 0;  // a resume: earlier launches' records after this step are dropped
};

class MetricSinks {
 public:
  explicit MetricSinks(const SinkOptions& options);
  ~MetricSinks();
  void write(const StepMetrics& m);
  // An evaluation: its JSONL row; TensorBoard val/NAME/loss and val/NAME/ppl; CSV
  // val_NAME_loss.csv and val_NAME_ppl.csv; a set of pairs' metrics likewise
  // (val/NAME/rewards/accuracies). CSV file names write '/' as '_' (rewards_chosen.csv).
  void write(const EvalMetrics& m);
  // A task's score: its JSONL row; TensorBoard task/NAME/acc and task/NAME/acc_norm; CSV
  // task_NAME_acc.csv and task_NAME_acc_norm.csv.
  void write(const TaskMetrics& m);
  // Text for TensorBoard's text tab (eval.samples), when the TensorBoard sink is on.
  void write_text(int64_t step, const std::string& tag, const std::string& text, double wall_time);

 private:
  void write_csv(const std::string& name, int64_t step, double value);
  SinkOptions o_;
  std::unique_ptr<JsonlSink> jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::map<std::string, std::FILE*> csv_;  // per metric
};

}  // namespace dstrain::metrics
