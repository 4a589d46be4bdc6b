#include "dstrain/model/loss.h"

#include <ATen/ATen.h>

#include "dstrain/model/chunked_cross_entropy.h"

namespace dstrain::model {

at::Tensor LossParts::mean() const {
  at::Tensor m = sum / static_cast<double>(std::max<int64_t>(count, 1));
  return aux.defined() ? m + aux : m;
}

void Loss::add_term(std::string name, double weight, Term term) { terms_.push_back({std::move(name), weight, std::move(term)}); }

CausalLM::Input input_of(const data::Batch& batch) {
  CausalLM::Input in{batch.tokens, {}, {}};
  if (!batch.sequential_positions) in.positions = batch.positions;
  if (batch.document_ids.defined()) in.attention_mask = document_causal_mask_of(batch.document_ids);
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

LossParts Loss::operator()(const CausalLM& model, const data::Batch& batch) const {
  return of_hidden(model, model.hidden_states(input_of(batch)), batch);
}

LossParts Loss::of_hidden(const CausalLM& model, const CausalLM::Hidden& h, const data::Batch& batch) const {
  LossParts parts;
  parts.count = batch.trained_targets;
  parts.aux = h.aux;
  at::Tensor sum;
  if (chunk_tokens_ > 0) {
    const at::Tensor flat = batch.labels.reshape({-1});
    const at::Tensor weights = batch.target_weights.defined() ? batch.target_weights.reshape({-1}) : at::Tensor();
    sum = chunked_linear_cross_entropy(h.hidden.reshape({flat.size(0), -1}), h.head, flat, chunk_tokens_, kIgnoreIndex, weights);
  } else {
    sum = summed_cross_entropy(at::linear(h.hidden, h.head), batch.labels, batch.target_weights);
  }
  for (const Weighted& t : terms_) sum = sum + t.term(model, h, batch) * t.weight;
  parts.sum = model.close(h, sum);
  return parts;
}

at::Tensor mean_loss(const CausalLM& model, const at::Tensor& tokens, const at::Tensor& labels, const at::Tensor& attention_mask) {
  const CausalLM::Hidden h = model.hidden_states({tokens, {}, attention_mask});
  const LossParts parts{model.close(h, summed_cross_entropy(at::linear(h.hidden, h.head), labels)),
                        labels.ne(kIgnoreIndex).sum().item<int64_t>(), h.aux};
  return parts.mean();
}

}  // namespace dstrain::model
