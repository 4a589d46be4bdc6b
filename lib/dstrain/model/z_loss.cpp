#include "dstrain/model/z_loss.h"

#include <ATen/ATen.h>

#include "dstrain/data/batch.h"
#include "dstrain/model/chunked_cross_entropy.h"
#include "dstrain/model/objective.h"

namespace dstrain::model {
namespace {

// A chunk of the head's logits: sum of w lse^2; d / d logits = 2 w lse softmax, in place.
at::Tensor z_loss_term(at::Tensor& logits, const at::Tensor& lse, const at::Tensor&, const at::Tensor& weights, bool with_grad) {
  const at::Tensor sum = (lse.squeeze(1).square() * weights).sum();
  if (with_grad) logits.sub_(lse).exp_().mul_(lse * weights.unsqueeze(1) * 2);
  return sum;
}

}  // namespace

at::Tensor summed_z_loss(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels, const at::Tensor& weights,
                         int64_t chunk_tokens) {
  const at::Tensor flat = labels.reshape({-1});
  const at::Tensor rows = hidden.reshape({flat.size(0), -1});
  const at::ScalarType wide = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor given = weights.defined() ? weights.reshape({-1}) : at::empty({0}, hidden.options().dtype(at::kFloat));
  if (chunk_tokens <= 0) {
    const at::Tensor lse = at::linear(rows, head).to(wide).logsumexp(-1);
    return (lse.square() * trained_row_weights(flat.ne(data::kIgnoreIndex), given, wide)).sum();
  }
  return chunked_linear_loss(rows, head, flat, chunk_tokens, data::kIgnoreIndex, given, z_loss_term);
}

void add_z_loss_term(Objective& objective, double weight) {
  if (weight == 0) return;
  const int64_t chunk = objective.chunk_tokens();
  objective.add_term("z_loss", "z_loss", weight, [chunk](const CausalLM&, const CausalLM::Hidden& h, const data::Batch& batch) {
    const at::Tensor trained = batch.labels.ne(data::kIgnoreIndex);
    // per_sample: the weights' sum, so that sum / count is a mean of sample means, as the loss reports.
    return TermValue{summed_z_loss(h.hidden, h.head, batch.labels, batch.target_weights, chunk),
                     batch.target_weights.defined() ? (batch.target_weights * trained).sum() : trained.sum()};
  });
}

}  // namespace dstrain::model
