#pragma once
// DPO's losses on preference pairs (train.objective dpo), per pair as TRL 1.16's DPOTrainer
// computes them (trainer/dpo_trainer.py, _compute_loss), from each completion's log-prob sum
// under the policy and the reference:
//   chosen_logratio = logp(chosen) - ref(chosen), rejected_logratio likewise,
//   delta = chosen_logratio - rejected_logratio, and for each preference.loss_type (times its weight):
//     sigmoid   -(1 - eps) logsigmoid(beta delta) - eps logsigmoid(-beta delta)   (eps: label_smoothing;
//               TRL 1.16 keeps only the first term; eps > 0 is cDPO as TRL < 1 computed it)
//     hinge     relu(1 - beta delta)
//     ipo       (delta' - 1 / (2 beta))^2, delta' from the log-ratios divided by each completion's tokens
//     robust    (-(1 - eps) logsigmoid(beta delta) + eps logsigmoid(-beta delta)) / (1 - 2 eps)
//     exo_pair, nca_pair, bco_pair, sppo_hard, apo_zero, apo_down, sigmoid_norm, discopop: as TRL
//     aot       sigmoid's smoothed loss on sorted(policy chosen - rejected) - sorted(reference's), over the
//               batch's pairs; aot_unpaired on sorted(chosen_logratio) - sorted(rejected_logratio): the sort
//               couples a micro-batch's pairs, as TRL's couples a device's batch
//     sft       the chosen completions' mean negative log-likelihood per token over the step (RPO as
//               TRL 1.16 has it: loss_type [sigmoid, sft] with loss_weights [1, alpha]); it enters as a
//               sum over pairs of each chosen sum / the step's chosen targets per pair
//   preference.use_weighting (WPO) multiplies each pair's losses by exp(wpo) of both completions;
//   preference.ld_alpha (LD-DPO) weighs each completion's tokens past the pair's shorter one
//   preference.f_divergence_type (f-DPO) replaces the log-ratios by f'(exp(log-ratio)) in the losses of
//   their difference (sigmoid, sigmoid_norm, hinge, ipo, exo_pair, robust, discopop), as TRL does
// The pair losses are summed (the runner divides by the step's pairs: a mean over pairs that does
// not depend on how the batch is split). Memory: the log-probs come from a chunked pass without
// autograd; the loss's gradient g_r with respect to each row's log-prob is then taken on those few
// numbers, and the model's gradient comes from the chunked cross-entropy weighted by -g_r per token
// (model/chunked_cross_entropy.h), whose gradient is exactly sum_r g_r d logp_r. Metrics, TRL's names, each a sum over its count:
//   rewards/chosen, rewards/rejected  beta x the log-ratios, over pairs
//   rewards/accuracies                pairs whose chosen reward is strictly above the rejected one
//   rewards/margins, logps/chosen, logps/rejected
//   logits/chosen, logits/rejected    the mean over the vocabulary of each completion token's
//                                     logits, over the completion tokens
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::config {
struct PreferenceConfig;
}
namespace dstrain::model {

class Objective;
struct TermValue;

// A metric's sum and count as an objective logs them: detached, in float64.
TermValue metric_term(const at::Tensor& sum, const at::Tensor& count);
// Row 2i (which 0: a pair's chosen sequence, an example) or 2i + 1 (which 1: its rejected one, its
// KL sequence) of a per-row tensor, for the batch's first `pairs`.
at::Tensor pair_half(const at::Tensor& rows, int64_t which, int64_t pairs);

// How completion_logps sums and what else it computes.
struct CompletionOptions {
  int64_t chunk_tokens = 0;  // the head's logits this many tokens at a time (0: all at once)
  // LD-DPO (preference.ld_alpha): in each pair, the targets past its shorter completion's count
  // weigh this much in `logps` (rows 2i and 2i + 1 are a pair); 1: plain sums.
  double ld_alpha = 1.0;
  bool wpo = false;  // also `wpo`
};

// Each row's log-prob sum over its trained targets and its sum over them of the logits' mean over
// the vocabulary (float32 [rows] each, no autograd), from the head's logits chunk_tokens at a time,
// so that a micro-batch's logits never exist whole.
//   logps         weighted by ld_alpha past the pair's shared length
//   plain         unweighted (the same tensor as logps when ld_alpha is 1)
//   token_weights each target's weight in logps (float32 [rows, T]; undefined when ld_alpha is 1)
//   wpo           WPO's mean over the targets of log p(token) - log sum_v p(v)^2 (with options.wpo)
struct RowLogps {
  at::Tensor logps, mean_logits, plain, token_weights, wpo;
};
RowLogps completion_logps(const CausalLM::Hidden& hidden, const data::Batch& batch, const CompletionOptions& options);
inline RowLogps completion_logps(const CausalLM::Hidden& hidden, const data::Batch& batch, int64_t chunk_tokens) {
  return completion_logps(hidden, batch, CompletionOptions{chunk_tokens});
}

// The metric names the DPO loss logs, in order.
const std::vector<std::string>& preference_metric_names();

// What a loss that is a token mean over the step's chosen sequences needs counted on its batches
// (data::Batch::chosen_targets_per_pair): the completions' targets (dpo's loss_type sft, cpo and
// simpo's NLL), or every target of the sequences, prompt included (orpo's NLL).
enum class ChosenTargets { kNone, kCompletions, kSequences };
ChosenTargets chosen_targets_counted(config::TrainObjective objective, const config::PreferenceConfig& config);

// Makes `objective` the DPO loss of `config` on preference batches (their reference log-probs set).
void set_preference_loss(Objective& objective, const config::PreferenceConfig& config);

}  // namespace dstrain::model
