#pragma once
// The preference losses without a reference model (train.objective cpo, simpo and orpo), per pair
// as TRL 1.16's CPOTrainer and ORPOTrainer (trl.experimental) compute them, from each completion's
// log-prob under the policy alone: its sum over the completion's tokens, or their mean (loss_type
// ipo and simpo, and orpo).
//   cpo, simpo  d = r(chosen) - r(rejected), r the log-prob, or with preference.alpha != 0 AlphaPO's
//               (1 - exp(-alpha logp)) / alpha; per preference.loss_type (simpo's is simpo):
//                 sigmoid  -(1 - eps) logsigmoid(beta d) - eps logsigmoid(-beta d)   (eps: label_smoothing)
//                 simpo    sigmoid's on d - simpo_gamma / beta
//                 hinge    relu(1 - beta d)
//                 ipo      (d - 1 / (2 beta))^2
//               plus cpo_alpha x the chosen completions' mean NLL per token over the step
//   orpo        the chosen sequences' mean NLL per token over the step, prompt tokens included,
//               - beta logsigmoid(log_odds), log_odds = (lc - lr) - (log(1 - e^lc) - log(1 - e^lr))
// The pair losses are summed (the runner divides by the step's pairs); an NLL enters as each
// chosen sum over the step's chosen targets per pair (data::Batch::chosen_targets_per_pair).
// As DPO's (model/preference_loss.h), the log-probs come from a chunked pass without autograd and
// the model's gradient from the chunked cross-entropy weighted per token. Metrics, TRL's names:
//   rewards/chosen, rewards/rejected  beta x r, over pairs; rewards/accuracies, rewards/margins
//   logps/chosen, logps/rejected      the log-probs the loss reads (means for ipo, simpo and orpo)
//   logits/chosen, logits/rejected    as DPO's, over the completion tokens (TRL's CPO and ORPO
//                                     average every position of the padded batch, prompt and
//                                     padding included, a number that depends on the padding)
//   nll_loss                          the chosen NLL per token (logged at cpo_alpha 0 too, where
//                                     TRL logs 0)
//   log_odds_ratio, log_odds_chosen   orpo's: the pairs' mean of logsigmoid(log_odds), of log_odds
#include <string>
#include <vector>

#include "dstrain/config/enums.h"

namespace dstrain::config {
struct PreferenceConfig;
}
namespace dstrain::model {

class Objective;

// The metric names `kind`'s loss logs, in order.
const std::vector<std::string>& reference_free_metric_names(config::TrainObjective kind);

// Makes `objective` the loss of `kind` (cpo, simpo or orpo) of `config` on preference batches.
void set_reference_free_loss(Objective& objective, config::TrainObjective kind, const config::PreferenceConfig& config);

}  // namespace dstrain::model
