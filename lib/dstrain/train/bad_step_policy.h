#pragma once
// train.on_bad_step, for a step whose loss or gradient norm is NaN/Inf outside fp16's loss
// scaling (fp16 overflows are the loss scaler's; the engine applied no update from a bad step):
//   stop      Error{kDiverged} (exit 8): the last checkpoint is intact
//   skip      go on without the update
//   rollback  back to the latest checkpoint in-process; bad again there means a bad batch or
//             model, not a transient fault: Error{kDiverged}
// More than train.max_bad_steps bad steps in one launch also stop the run.
#include <cstdint>
#include <string>

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::zero {
struct StepResult;
}

namespace dstrain::train {

class BadStepPolicy {
 public:
  enum class Action { kApply, kSkip, kRollback };
  BadStepPolicy(const config::Recipe& recipe, int rank);
  // Step `step` (1-based) ended in `result` with the global mean `loss`. Throws when the run must
  // stop; rank 0 logs skips. After kRollback, describe() says what was bad.
  Action judge(int64_t step, const zero::StepResult& result, double loss);
  const std::string& describe() const { return what_; }
  int64_t bad_steps() const { return bad_steps_; }
  int64_t max_bad_steps() const;

 private:
  const config::Recipe& recipe_;
  int rank_;
  int64_t bad_steps_ = 0;        // in this launch
  int64_t rolled_back_at_ = -1;  // the step whose badness caused the last rollback
  std::string what_;
};

}  // namespace dstrain::train
