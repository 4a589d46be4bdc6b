#pragma once
// The cross-entropy as the objective (model/objective.h) and the tests compute it: summed over
// the trained targets in fp32, from logits or fused with the head a chunk at a time.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

using data::kIgnoreIndex;

// The model's input for a batch: tokens, positions when they are not 0..T-1, and the
// document mask when the batch cuts documents.
CausalLM::Input input_of(const data::Batch& batch);
// The summed next-token cross-entropy of logits' rows against labels (kIgnoreIndex skipped),
// in fp32 (double for a double model); each target's term times its weight when `weights` (the
// labels' shape) is given (train.loss_normalization per_sample).
at::Tensor summed_cross_entropy(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& weights = {});
// The same from hidden states [..., H] and the head [V, H]: chunked and fused with the head when
// chunk_tokens > 0 (chunked_cross_entropy.h), else through the whole logits.
at::Tensor head_cross_entropy(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels, const at::Tensor& weights,
                              int64_t chunk_tokens);
// A lone batch's mean loss, for tests and benchmarks: `labels` int64 [B, T].
at::Tensor mean_loss(const CausalLM& model, const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor& attention_mask = {});

}  // namespace dstrain::model
