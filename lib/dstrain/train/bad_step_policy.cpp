#include "dstrain/train/bad_step_policy.h"

#include <fmt/format.h>

#include <cmath>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {

BadStepPolicy::BadStepPolicy(const config::Recipe& recipe, int rank) : recipe_(recipe), rank_(rank) {}

int64_t BadStepPolicy::max_bad_steps() const { return recipe_.train.max_bad_steps; }

BadStepPolicy::Action BadStepPolicy::judge(int64_t step, const zero::StepResult& result, double loss) {
  using config::BadStepAction;
  const BadStepAction policy = recipe_.train.on_bad_step;
  const bool bad = recipe_.precision.dtype != config::Dtype::kFp16 && (result.skipped || !std::isfinite(loss));
  if (!bad) return Action::kApply;
  ++bad_steps_;
  const bool loss_bad = !std::isfinite(loss);
  what_ = fmt::format("step {}: the {} is {} (train.on_bad_step = {})", step, loss_bad ? "loss" : "gradient norm",
                      loss_bad ? fmt::format("{}", loss) : fmt::format("{}", result.grad_norm), config::name(policy));
  if (policy == BadStepAction::kStop || bad_steps_ > max_bad_steps())
    throw Error(ErrorCode::kDiverged,
                policy == BadStepAction::kStop ? what_ + ": stopped; no update was applied and the last checkpoint is intact"
                                               : fmt::format("{}: {} bad steps in this launch, more than train.max_bad_steps = {}", what_,
                                                             bad_steps_, max_bad_steps()),
                "resume from the last checkpoint with `dstrain resume` (a transient fault will not recur), or set train.on_bad_step: skip "
                "/ rollback; "
                "lower the learning rate if the loss diverged");
  if (policy == BadStepAction::kRollback) {
    if (rolled_back_at_ == step)
      throw Error(ErrorCode::kDiverged,
                  what_ + ": bad again after rolling back, so the cause is in the data or the model, not a transient fault",
                  "set train.on_bad_step: skip to pass over this step, or lower the learning rate");
    rolled_back_at_ = step;
    return Action::kRollback;
  }
  if (rank_ == 0) log::warn(fmt::format("{}: update skipped (bad step {} of at most {})", what_, bad_steps_, max_bad_steps()));
  return Action::kSkip;
}

}  // namespace dstrain::train
