#pragma once
// A micro-batch's share of the step's loss, written once for every runner. The share follows
// train.loss_normalization. Each micro-batch m has a numerator and a count of units; the step's
// loss is sum_m numerator_m / N, N the units of every micro-batch of every rank, summed once per
// step (global_loss_units):
//   global_tokens     numerator = its summed token losses, units = its trained targets: every
//                     micro-batch of every rank weighs by what it trains, and the summed
//                     gradients are the global batch's mean gradient whatever the shares,
//                     accumulation steps, world size or masks
//   micro_batch_mean  numerator = its mean token loss, units = 1 (when it trains anything): the
//                     mean of micro-batch means, DeepSpeed's and Megatron's default
//   per_sample        numerator = sum over its samples of each one's mean (data::weigh_per_sample),
//                     units = its samples: the mean of sample means
// An MoE auxiliary loss (already a mean) weighs by the micro-batch's units / N.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/batch.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
struct ObjectiveValue;
enum class ChosenTargets;  // model/preference_loss.h
}  // namespace dstrain::model

namespace dstrain::train {

// A micro-batch's share: `loss` to differentiate (the objective's value divided, plus its
// auxiliary losses' share when `with_aux`), and `terms_share`, the part of it the terms make,
// which the reported loss leaves out (undefined without terms).
struct LossShare {
  at::Tensor loss, terms_share;
  // What the run reports of `loss` (after any observer replaced it): detached, terms left out.
  at::Tensor reported(const at::Tensor& final_loss) const;
};
LossShare loss_share(const model::ObjectiveValue& value, const data::Batch& host_batch, config::LossNormalization mode, double global_units,
                     bool with_aux = true);
// The auxiliary losses' share of a micro-batch (a pipeline's stage before the last: no objective).
at::Tensor aux_share(const at::Tensor& aux, const data::Batch& host_batch, config::LossNormalization mode, double global_units);

// A micro-batch's units under `mode` (see above).
int64_t loss_units(const data::Batch& batch, config::LossNormalization mode);
// The units of every rank's `batches`, summed (collective: one small all-reduce).
int64_t global_loss_units(comm::Communicator& comm, const std::vector<data::Batch>& batches,
                          config::LossNormalization mode = config::LossNormalization::kGlobalTokens);
// The same, and the chosen sequences' targets `counted` of every rank's preference batches
// (data::chosen_targets, data::chosen_sequence_targets): one all-reduce for both.
struct StepUnits {
  int64_t units = 0, chosen_targets = 0;
};
StepUnits global_step_units(comm::Communicator& comm, const std::vector<data::Batch>& batches, config::LossNormalization mode,
                            model::ChosenTargets counted);
// A training step's units under `recipe`; with preference.loss_type sft (a token mean over the
// step's chosen completions, entered as a sum over its pairs) each batch's chosen_targets_per_pair set.
int64_t step_units(comm::Communicator& comm, std::vector<data::Batch>& batches, const config::Recipe& recipe);

}  // namespace dstrain::train
