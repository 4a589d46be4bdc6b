#pragma once
// PaLM's z-loss (Chowdhery et al. 2022, §5): weight x log(Z)^2 per trained target, Z the softmax's
// partition function (logsumexp of the logits), which keeps log Z near 0 and the logits from
// drifting in large runs. One objective term (model/objective.h), token-summed as the
// cross-entropy is, so the step divides it by the same units (train.loss_normalization) and it
// works wherever the objective does; logged as "z_loss": the mean log(Z)^2 over the trained
// targets, before its weight. The head's logits are computed a second time for it (chunked when
// the cross-entropy is: train.loss_chunk_tokens).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dstrain::model {

class Objective;

// Sum over the targets that train (labels != kIgnoreIndex) of logsumexp(hidden x head^T)^2, times
// each target's weight when `weights` (the labels' shape) is given; in fp32 (double for a double
// model). hidden [..., H], head [V, H]; chunk_tokens > 0: that many rows of logits at a time, each
// chunk's gradients computed in the forward pass (as the chunked cross-entropy does).
at::Tensor summed_z_loss(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels, const at::Tensor& weights,
                         int64_t chunk_tokens);
// Adds the term "z_loss" with `weight` (train.z_loss_weight; nothing when 0).
void add_z_loss_term(Objective& objective, double weight);

}  // namespace dstrain::model
