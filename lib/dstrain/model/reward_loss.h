#pragma once
// A reward model's loss on preference pairs (train.objective reward), as TRL 1.16's RewardTrainer
// computes it (trainer/reward_trainer.py, compute_loss): each row's score is the score head
// (model.score_head: score.weight [1, H]) applied to the final hidden state at the row's score
// position (data/score_token.h: its last token that is not the pad token), and per pair
//   -logsigmoid(chosen score - rejected score [- margin]) + center_rewards_coefficient x (chosen + rejected)^2
// summed over the batch's pairs (the runner divides by the step's pairs: TRL's mean over a
// full batch, and the same however the step is split); margin: the pair's (data::Batch::margins),
// when its set has them, as TRL subtracts a dataset's "margin" column. Metrics, TRL's names, each a sum over its count:
//   accuracy     pairs whose chosen score is strictly above the rejected one, over pairs
//   margin       chosen score - rejected score, over pairs
//   mean_reward  every score, over the rows (two per pair)
// TRL's min_reward and max_reward are not sums over counts, and are not logged.
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

// Each row's score (float32 [rows], with the graph when the hidden states have one).
at::Tensor sequence_scores(const CausalLM::Hidden& hidden, const data::Batch& batch);

// The metric names the reward loss logs, in order.
const std::vector<std::string>& reward_metric_names();

// Makes `objective` the reward model's loss of `config` on preference batches with score positions.
void set_reward_loss(Objective& objective, const config::PreferenceConfig& config);

// The loss of train.objective on preference pairs: dpo's (model/preference_loss.h), reward's, or
// cpo's, simpo's and orpo's (model/reference_free_loss.h), or kto's on unpaired examples
// (model/kto_loss.h); sft leaves `objective` as it is.
void set_pair_loss(Objective& objective, config::TrainObjective kind, const config::PreferenceConfig& config);

}  // namespace dstrain::model
