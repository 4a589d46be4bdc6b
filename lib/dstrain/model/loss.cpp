#include "dstrain/model/loss.h"

#include <ATen/ATen.h>

#include "dstrain/model/chunked_cross_entropy.h"

namespace dstrain::model {

CausalLM::Input input_of(const data::Batch& batch) {
  CausalLM::Input in{batch.tokens, {}, {}};
  if (!batch.sequential_positions) in.positions = batch.positions;
  in.document_ids = batch.document_ids;  // the attention scope builds the document mask
  in.first_row = batch.first_row;
  in.ahead_tokens = batch.ahead_tokens;
  return in;
}

at::Tensor summed_cross_entropy(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& weights) {
  const at::Tensor flat = labels.reshape({-1});
  // bf16/fp16 logits: the softmax and the sum run in fp32. Ignored targets contribute nothing.
  const at::Tensor wide = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
  if (!weights.defined()) return at::cross_entropy_loss(wide.reshape({flat.size(0), -1}), flat, {}, at::Reduction::Sum, kIgnoreIndex);
  const at::Tensor each = at::cross_entropy_loss(wide.reshape({flat.size(0), -1}), flat, {}, at::Reduction::None, kIgnoreIndex);
  return (each * weights.reshape({-1}).to(each.scalar_type())).sum();
}

at::Tensor head_cross_entropy(const at::Tensor& hidden, const at::Tensor& head, const at::Tensor& labels, const at::Tensor& weights,
                              int64_t chunk_tokens) {
  if (chunk_tokens <= 0) return summed_cross_entropy(at::linear(hidden, head), labels, weights);
  const at::Tensor flat = labels.reshape({-1});
  return chunked_linear_cross_entropy(hidden.reshape({flat.size(0), -1}), head, flat, chunk_tokens, kIgnoreIndex,
                                      weights.defined() ? weights.reshape({-1}) : at::Tensor());
}

at::Tensor mean_loss(const CausalLM& model, const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor& attention_mask) {
  const CausalLM::Hidden h = model.hidden_states({tokens, {}, attention_mask});
  const at::Tensor sum = model.close(h, summed_cross_entropy(at::linear(h.hidden, h.head), labels));
  const at::Tensor mean = sum / static_cast<double>(std::max<int64_t>(labels.ne(kIgnoreIndex).sum().item<int64_t>(), 1));
  return h.aux.defined() ? mean + h.aux : mean;
}

}  // namespace dstrain::model
