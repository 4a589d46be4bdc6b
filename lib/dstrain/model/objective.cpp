#include "dstrain/model/objective.h"

#include <ATen/ATen.h>

#include "dstrain/core/error.h"
#include "dstrain/model/loss.h"

namespace dstrain::model {

at::Tensor ObjectiveValue::mean() const {
  at::Tensor m = sum / static_cast<double>(std::max<int64_t>(count, 1));
  return aux.defined() ? m + aux : m;
}

void Objective::add_term(std::string name, std::string metric, double weight, Term term) {
  for (const Weighted& t : terms_)
    if (t.name == name || (t.metric == metric && terms_.back().metric != metric))
      throw Error(ErrorCode::kInternal, "objective term " + name + ": a name taken, or its metric's terms not adjacent",
                  "report this as a bug");
  terms_.push_back({std::move(name), std::move(metric), weight, std::move(term)});
}

void Objective::set_weight(const std::string& name, double weight) {
  for (Weighted& t : terms_)
    if (t.name == name) {
      t.weight = weight;
      return;
    }
  throw Error(ErrorCode::kInternal, "no objective term named " + name, "report this as a bug");
}

void Objective::set_sequence_loss(std::vector<std::string> metrics, SequenceLoss loss) {
  sequence_metrics_ = std::move(metrics), sequence_loss_ = std::move(loss);
}

std::vector<MetricShape> Objective::metrics() const {
  std::vector<MetricShape> out;
  for (const std::string& name : sequence_metrics_) out.push_back({name, 1});
  for (const Weighted& t : terms_) {
    if (out.empty() || out.back().name != t.metric) out.push_back({t.metric, 0});
    ++out.back().values;
  }
  return out;
}

ObjectiveValue Objective::operator()(const CausalLM& model, const data::Batch& batch) const {
  return of_hidden(model, model.hidden_states(input_of(batch)), batch);
}

ObjectiveValue Objective::of_hidden(const CausalLM& model, const CausalLM::Hidden& h, const data::Batch& batch) const {
  ObjectiveValue v;
  v.count = batch.trained_targets;
  v.aux = h.aux;
  std::vector<at::Tensor> rows;
  at::Tensor sum;
  if (sequence_loss_) {
    const SequenceLossValue s = sequence_loss_(model, h, batch);
    v.count = batch.pairs;
    sum = s.sum;
    for (const TermValue& m : s.metrics) rows.push_back(at::stack({m.sum.to(at::kDouble), m.count.to(at::kDouble)}));
  } else {
    sum = head_cross_entropy(h.hidden, h.head, batch.labels, batch.target_weights, chunk_tokens_);
  }
  v.main = sum.detach();
  for (const Weighted& t : terms_) {
    const TermValue value = t.term(model, h, batch);
    rows.push_back(at::stack({value.sum.detach().to(at::kDouble), value.count.to(at::kDouble)}));
    sum = sum + value.sum * t.weight;
  }
  if (!rows.empty()) v.terms = at::stack(rows);
  v.sum = model.close(h, sum);
  return v;
}

}  // namespace dstrain::model
