#pragma once
// KTO's loss on an unpaired set (train.objective kto), per example as TRL 1.16's KTOTrainer
// computes it (trainer/kto_trainer.py, _compute_loss), from each completion's log-prob sum under
// the policy and the reference. Rows 2i and 2i + 1 of a batch are example i and its KL sequence
// (its prompt with another example's completion: data/kto_set.h); data::Batch::desirable labels
// the examples.
//   logratio  logp(completion) - ref(completion)
//   kl        max(0, mean over the micro-batch's examples of logp(KL) - ref(KL)), without gradient
//             (TRL: over a device's batch, then averaged over the devices; here over each micro-batch
//             on its rank, so that the losses do not depend on the world size)
//   kto       desirable: 1 - sigmoid(beta (logratio - kl)); undesirable: 1 - sigmoid(beta (kl - logratio))
//   apo_zero_unpaired  desirable: 1 - sigmoid(beta logratio); undesirable: sigmoid(beta logratio) (kl 0)
// each times preference.desirable_weight or undesirable_weight, summed over the examples (the
// runner divides by the step's examples: TRL's mean over a full batch). As DPO's
// (model/preference_loss.h), the log-probs come from a chunked pass without autograd and the
// model's gradient from the chunked cross-entropy weighted per token. Metrics, TRL's names:
//   kl                                 the micro-batches' mean
//   rewards/chosen, rewards/rejected   beta x logratio over the desirable (undesirable) examples
//   rewards/margins                    per micro-batch chosen - rejected mean (with both kinds), the micro-batches' mean
//   logps/chosen, logps/rejected       the completions' log-prob sums, over the examples of that kind
//   logits/chosen, logits/rejected     as DPO's, over the completion tokens of that kind
#include <string>
#include <vector>

namespace dstrain::config {
struct PreferenceConfig;
}
namespace dstrain::model {

class Objective;

// The metric names the KTO loss logs, in order.
const std::vector<std::string>& kto_metric_names();

// Makes `objective` KTO's loss of `config` on unpaired batches (their reference log-probs set).
void set_kto_loss(Objective& objective, const config::PreferenceConfig& config);

}  // namespace dstrain::model
