#include "dstrain/train/loss_share.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/model/objective.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/model/preference_loss.h"

namespace dstrain::train {

at::Tensor LossShare::reported(const at::Tensor& final_loss) const {
  return terms_share.defined() ? final_loss.detach() - terms_share : final_loss.detach();
}

at::Tensor aux_share(const at::Tensor& aux, const data::Batch& host_batch, config::LossNormalization mode, double global) {
  // The auxiliary losses are means over the micro-batch: weighted by its share of the units. A
  // sequence-parallel rank's aux is its part of the whole rows' (model/mla_moe_model.cpp), so the
  // whole rows' units weigh it.
  int64_t units = loss_units(host_batch, mode);
  if (host_batch.whole_trained_targets >= 0) {
    data::Batch whole;
    whole.trained_targets = host_batch.whole_trained_targets, whole.samples = host_batch.whole_samples;
    units = loss_units(whole, mode);
  }
  return aux.defined() ? aux * (static_cast<double>(units) / global) : at::Tensor();
}

LossShare loss_share(const model::ObjectiveValue& value, const data::Batch& host_batch, config::LossNormalization mode, double global,
                     bool with_aux) {
  const double divisor =
      mode == config::LossNormalization::kMicroBatchMean ? static_cast<double>(std::max<int64_t>(value.count, 1)) * global : global;
  LossShare share{value.sum / divisor, value.terms.defined() ? (value.sum.detach() - value.main) / divisor : at::Tensor()};
  if (with_aux && value.aux.defined()) share.loss = share.loss + aux_share(value.aux, host_batch, mode, global);
  return share;
}

int64_t loss_units(const data::Batch& batch, config::LossNormalization mode) {
  if (batch.pairs > 0) return mode == config::LossNormalization::kMicroBatchMean ? 1 : batch.pairs;  // preference pairs: a mean over pairs
  switch (mode) {
    case config::LossNormalization::kMicroBatchMean:
      return batch.trained_targets > 0 ? 1 : 0;
    case config::LossNormalization::kPerSample:
      return batch.samples;
    case config::LossNormalization::kGlobalTokens:
      break;
  }
  return batch.trained_targets;
}

int64_t global_loss_units(comm::Communicator& comm, const std::vector<data::Batch>& batches, config::LossNormalization mode) {
  return global_step_units(comm, batches, mode, model::ChosenTargets::kNone).units;
}

StepUnits global_step_units(comm::Communicator& comm, const std::vector<data::Batch>& batches, config::LossNormalization mode,
                            model::ChosenTargets counted) {
  const bool chosen = counted != model::ChosenTargets::kNone;
  std::vector<int64_t> mine(chosen ? 2 : 1, 0);
  for (const data::Batch& b : batches) {
    mine[0] += loss_units(b, mode);
    if (counted == model::ChosenTargets::kCompletions) mine[1] += data::chosen_targets(b);
    if (counted == model::ChosenTargets::kSequences) mine[1] += data::chosen_sequence_targets(b);
  }
  const std::vector<int64_t> all = comm::sum_exactly(comm, mine);
  return {all[0], chosen ? all[1] : 0};
}

int64_t step_units(comm::Communicator& comm, std::vector<data::Batch>& batches, const config::Recipe& recipe) {
  const model::ChosenTargets counted = model::chosen_targets_counted(recipe.train.objective, recipe.preference);
  const StepUnits units = global_step_units(comm, batches, recipe.train.loss_normalization, counted);
  if (counted != model::ChosenTargets::kNone)
    for (data::Batch& b : batches)
      b.chosen_targets_per_pair = static_cast<double>(units.chosen_targets) / static_cast<double>(std::max<int64_t>(units.units, 1));
  return units.units;
}

}  // namespace dstrain::train
