#pragma once
// Multi-token prediction's loss terms (DeepSeek-V3 §2.2): depth k's cross-entropy, from the
// model's MTP hidden states (CausalLM::Hidden::mtp) through the shared head, token-summed over
// its targets, added to the loss with weight λ / D. The step divides it by the step's trained
// (main) targets, as Eq. 24 divides by T, Megatron by num_tokens and torchtitan by the global
// valid tokens.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"

namespace dstrain::model {

class Objective;

// Depth k's targets [B, T - k]: at position i the main target at i + k (the token i + k + 1),
// kept only where that target trains (loss masks, packed conversations' ends) and, when the batch
// cuts documents, where position i + k lies in position i's document: no MTP input crosses a
// document, and a target only where the main loss's own does. A sequence-parallel share
// (Batch::ahead_labels): [B, T] over all its positions, the targets past it read from the columns
// after the share, none past the whole row's end.
at::Tensor mtp_labels(const data::Batch& batch, int64_t k);
// The weights of those targets under per_sample normalization (undefined otherwise).
at::Tensor mtp_target_weights(const data::Batch& batch, int64_t k);

// The name of depth k's term ("mtp_1", ...); every depth is logged under "mtp_loss".
std::string mtp_term_name(int64_t k);
// Adds config.mtp_depth terms (none when 0), each weighted λ / D with λ = mtp_weight_at(tokens).
void add_mtp_terms(Objective& objective, const config::ModelConfig& config, int64_t tokens = 0);
// The weights for a step that starts after `tokens` trained tokens (the schedule of λ).
void set_mtp_weights(Objective& objective, const config::ModelConfig& config, int64_t tokens);

}  // namespace dstrain::model
