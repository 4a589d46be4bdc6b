#include "dstrain/model/loss.h"

#include <ATen/ATen.h>

#include "dstrain/core/error.h"
#include "dstrain/model/chunked_cross_entropy.h"

namespace dstrain::model {

at::Tensor LossParts::mean() const {
  at::Tensor m = sum / static_cast<double>(std::max<int64_t>(count, 1));
  return aux.defined() ? m + aux : m;
}

void Loss::add_term(std::string name, double weight, Term term) { terms_.push_back({std::move(name), weight, std::move(term)}); }

void Loss::set_weight(const std::string& name, double weight) {
  for (Weighted& t : terms_)
    if (t.name == name) {
      t.weight = weight;
      return;
    }
  throw Error(ErrorCode::kInternal, "no loss term named " + name, "report this as a bug");
}

CausalLM::Input input_of(const data::Batch& batch) {
  CausalLM::Input in{batch.tokens, {}, {}};
  if (!batch.sequential_positions) in.positions = batch.positions;
  in.document_ids = batch.document_ids;  // the attention scope builds the document mask
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
  at::Tensor sum = head_cross_entropy(h.hidden, h.head, batch.labels, batch.target_weights, chunk_tokens_);
  parts.main = sum.detach();
  for (const Weighted& t : terms_) {
    const TermValue v = t.term(model, h, batch);
    parts.terms.push_back({v.sum.detach(), v.count});
    sum = sum + v.sum * t.weight;
  }
  parts.sum = model.close(h, sum);
  return parts;
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
  LossParts parts;
  parts.sum = model.close(h, summed_cross_entropy(at::linear(h.hidden, h.head), labels));
  parts.count = labels.ne(kIgnoreIndex).sum().item<int64_t>(), parts.aux = h.aux;
  return parts.mean();
}

}  // namespace dstrain::model
