#include "dstrain/train/eval_tracker.h"

#include <ATen/ATen.h>

#include "dstrain/config/recipe.h"

namespace dstrain::train {

EvalTracker::EvalTracker(const config::Recipe& recipe)
    : enabled_(recipe.eval.enabled()), patience_(recipe.eval.early_stopping_patience), min_delta_(recipe.eval.early_stopping_min_delta) {}

EvalTracker::Verdict EvalTracker::record(int64_t step, double loss) {
  Verdict v;
  // NaN never improves (and counts against patience).
  if (best_step_ < 0 ? loss == loss : loss < best_ - min_delta_) {
    best_ = loss, best_step_ = step, since_best_ = 0;
    v.improved = true;
  } else {
    ++since_best_;
  }
  v.stop = stopped();
  return v;
}

bool EvalTracker::stopped() const { return patience_ > 0 && since_best_ >= patience_; }

model::NamedTensors EvalTracker::state() const {
  if (!enabled_) return {};
  return {{"eval.state",
           at::tensor(std::vector<double>{best_, static_cast<double>(best_step_), static_cast<double>(since_best_)}, at::kDouble)}};
}

void EvalTracker::load_state(const model::NamedTensors& state) {
  if (state.empty()) return;
  const at::Tensor t = state.at(0).tensor.to(at::kDouble).contiguous();
  const double* v = t.data_ptr<double>();
  best_ = v[0], best_step_ = static_cast<int64_t>(v[1]), since_best_ = static_cast<int64_t>(v[2]);
}

}  // namespace dstrain::train
