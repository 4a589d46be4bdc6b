#pragma once
// The best validation loss so far and early stopping (HF's EarlyStoppingCallback semantics): an
// evaluation improves when its loss is below the best by more than eval.early_stopping_min_delta;
// eval.early_stopping_patience evaluations in a row without an improvement stop the run. The
// state (best loss, its step, the evaluations since) is checkpointed, so a resumed run keeps the
// same best checkpoint and stops at the same step as an uninterrupted one.
#include <cstdint>
#include <limits>

#include "dstrain/model/stateful.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::train {

class EvalTracker final : public model::Stateful {
 public:
  explicit EvalTracker(const config::Recipe& recipe);
  struct Verdict {
    bool improved = false;  // a new best (keep_best saves this step)
    bool stop = false;      // patience ran out
  };
  // The first set's loss at step `step` (1-based, done).
  Verdict record(int64_t step, double loss);
  double best() const { return best_; }
  int64_t best_step() const { return best_step_; }  // -1: none yet
  int64_t since_best() const { return since_best_; }
  bool stopped() const;  // patience ran out (a resume of a run that stopped early has nothing to do)

  model::NamedTensors state() const override;  // eval.state: [best, best step, evaluations since], when eval is on
  void load_state(const model::NamedTensors& state) override;
  bool state_optional() const override { return true; }  // a checkpoint from before eval was configured

 private:
  bool enabled_;
  int64_t patience_;
  double min_delta_;
  double best_ = std::numeric_limits<double>::infinity();
  int64_t best_step_ = -1;
  int64_t since_best_ = 0;
};

}  // namespace dstrain::train
