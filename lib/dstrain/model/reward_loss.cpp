#include "dstrain/model/reward_loss.h"

#include <ATen/ATen.h>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "dstrain/model/kto_loss.h"
#include "dstrain/model/reference_free_loss.h"

namespace dstrain::model {

at::Tensor sequence_scores(const CausalLM::Hidden& h, const data::Batch& batch) {
  if (!batch.score_positions.defined())
    throw Error(ErrorCode::kInternal, "a reward model's batch without score positions", "report this as a bug");
  if (h.head.size(0) != 1)
    throw Error(ErrorCode::kInternal, "train.objective reward on a model without a score head (model.score_head)", "report this as a bug");
  const at::Tensor rows = at::arange(h.hidden.size(0), batch.score_positions.options());
  const at::Tensor last = h.hidden.index({rows, batch.score_positions});  // [rows, H]
  return at::linear(last, h.head).squeeze(-1).to(at::kFloat);
}

const std::vector<std::string>& reward_metric_names() {
  static const std::vector<std::string> names = {"accuracy", "margin", "mean_reward"};
  return names;
}

void set_reward_loss(Objective& objective, const config::PreferenceConfig& c) {
  const double center = c.center_rewards_coefficient;
  objective.set_sequence_loss(reward_metric_names(), [center](const CausalLM&, const CausalLM::Hidden& h, const data::Batch& batch) {
    const int64_t n = batch.pairs;
    const at::Tensor scores = sequence_scores(h, batch);
    const at::Tensor chosen = scores.view({-1, 2}).select(1, 0).narrow(0, 0, n),
                     rejected = scores.view({-1, 2}).select(1, 1).narrow(0, 0, n);
    at::Tensor difference = chosen - rejected;
    if (batch.margins.defined()) difference = difference - batch.margins.to(scores.device()).narrow(0, 0, n);
    at::Tensor per_pair = -at::log_sigmoid(difference);
    if (center != 0) per_pair = per_pair + center * (chosen + rejected).pow(2);
    const auto count = [&](double value) { return at::full({}, value, at::TensorOptions().dtype(at::kDouble).device(scores.device())); };
    const auto metric = [](const at::Tensor& sum, const at::Tensor& of) { return TermValue{sum.detach().to(at::kDouble), of}; };
    const at::Tensor sc = chosen.detach(), sr = rejected.detach();
    SequenceLossValue v;
    v.sum = per_pair.sum();
    v.metrics = {metric((sc > sr).sum(), count(static_cast<double>(n))), metric((sc - sr).sum(), count(static_cast<double>(n))),
                 metric(sc.sum() + sr.sum(), count(2.0 * static_cast<double>(n)))};
    return v;
  });
}

void set_pair_loss(Objective& objective, config::TrainObjective kind, const config::PreferenceConfig& c) {
  if (kind == config::TrainObjective::kDpo) set_preference_loss(objective, c);
  if (kind == config::TrainObjective::kReward) set_reward_loss(objective, c);
  if (kind == config::TrainObjective::kCpo || kind == config::TrainObjective::kSimpo || kind == config::TrainObjective::kOrpo)
    set_reference_free_loss(objective, kind, c);
  if (kind == config::TrainObjective::kKto) set_kto_loss(objective, c);
}

}  // namespace dstrain::model
