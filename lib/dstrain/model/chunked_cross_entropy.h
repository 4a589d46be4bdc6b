#pragma once
// The LM head and the cross-entropy together, a chunk of tokens at a time (issue 21): the
// logits of `chunk_tokens` rows exist at once, never those of the whole micro-batch (at
// 4 x 2048 tokens and a 32,256-token vocabulary the full fp32 logits alone are 1 GiB, and
// autograd kept them and their gradient). Each chunk's gradients for the hidden states and the
// head are computed in the forward pass, while its logits are at hand (as Liger's fused linear
// cross-entropy does); backward only scales them by the incoming gradient. Same math as
// at::cross_entropy_loss(linear(hidden, weight)) with reduction sum: the softmax in fp32 (double
// for a double model), ignored targets (kIgnoreIndex) contribute nothing.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dstrain::model {

// hidden [N, H], weight [V, H] (the model dtype), targets int64 [N]: the summed cross-entropy,
// a scalar in fp32 (double for double inputs) that autograd differentiates w.r.t. hidden and
// weight. chunk_tokens >= 1. target_weights (float [N], optional): each target's term times its
// weight (train.loss_normalization per_sample).
at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, int64_t chunk_tokens,
                                        int64_t ignore_index, const at::Tensor& target_weights = {});

// Any per-target loss of the head's logits the same way (the z-loss: model/z_loss.h). A chunk's
// term gets its logits [n, V] (fp32, or double), their logsumexp [n, 1], the targets and each
// row's weight (0 where the target is ignored); it returns the chunk's weighted sum and, when
// `with_grad`, turns `logits` in place into that sum's gradient with respect to them.
using ChunkTerm = at::Tensor (*)(at::Tensor& logits, const at::Tensor& lse, const at::Tensor& targets, const at::Tensor& weights,
                                 bool with_grad);
// Each row's weight in a per-target loss: its target weight (all 1 when `target_weights` is
// empty) where the row trains (`valid`), else 0; in `wide`.
at::Tensor trained_row_weights(const at::Tensor& valid, const at::Tensor& target_weights, at::ScalarType wide);
at::Tensor chunked_linear_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, int64_t chunk_tokens,
                               int64_t ignore_index, const at::Tensor& target_weights, ChunkTerm term);

}  // namespace dstrain::model
