#pragma once
// What scoring tasks gives back (train/choice_scores.h, train/generative_scores.h,
// train/task_scores.h): each task's score, the result JSON and the --log-samples lines.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::train {

// A task's score: acc and acc_norm (multiple choice), or exact_match (and the flexible
// extraction's, gsm8k) of a generative task; the others NaN.
struct TaskScore {
  std::string name;
  double acc = std::nan(""), acc_norm = std::nan(""), exact_match = std::nan(""), exact_match_flexible = std::nan("");
  int64_t questions = 0, requests = 0;
};
// Every task's scores over all ranks (`scores`), as the result JSON text
// {"step", "world_size", "tasks": [{"name", "acc", "acc_norm", "n", "requests"} or
// {"name", "exact_match", ["exact_match_flexible",] "n", "requests", "eval_ms"}]} (eval_ms: the
// generation's wall time), and each question as a JSON
// line (--log-samples, as lm-eval's): {"task", "index", "gold", "loglikelihoods", "pred",
// "pred_norm"}, or {"task", "index", "target", "generation", "answers", "exact_match"}; on every rank.
struct TaskResults {
  std::string json, samples;
  std::vector<TaskScore> scores;
};

}  // namespace dstrain::train
