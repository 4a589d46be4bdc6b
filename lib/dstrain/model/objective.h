#pragma once
// What a training step minimises, outside the models and the runners: a model gives its final
// hidden states (CausalLM::hidden_states) and the objective turns them into one token-summed
// value to differentiate, with every part of it named for the metrics.
//   cross-entropy   always, the run's "loss": the head's logits (chunked and fused with the
//                   cross-entropy when chunk_tokens > 0) against the batch's labels
//   terms           add_term(): any number, each token-summed over the targets it counts and
//                   added times its weight (multi-token prediction, z-loss, distillation), each
//                   logged under its metric's name as its sum over its count
//   auxiliary       the model's own (MoE balance), already a weighted mean
// A runner (train/step_runner.h) divides the value by the step's units once
// (train/loss_share.h), so every micro-batch of every rank weighs by what it trains.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

// A term's value on one batch: token-summed, and the targets it covers (a scalar tensor, so that
// counting needs no synchronisation; with per-target weights, their sum).
struct TermValue {
  at::Tensor sum, count;
};

// A metric that terms are logged under: one value per term (MTP's depths: mtp_loss, D values).
struct MetricShape {
  std::string name;
  size_t values = 0;
};

// A loss over whole sequences that replaces the cross-entropy (preference pairs: model/preference_loss.h):
// its value summed over its units (with grad) and its metrics, each (sum, count), in the order named.
struct SequenceLossValue {
  at::Tensor sum;
  std::vector<TermValue> metrics;
};

struct ObjectiveValue {
  at::Tensor sum;     // token-summed: the cross-entropy plus each term x its weight (a scalar with grad)
  at::Tensor main;    // the cross-entropy alone, token-summed (detached): what the run reports as its loss
  int64_t count = 0;  // the batch's trained targets (a sequence loss: its pairs)
  at::Tensor aux;     // the model's auxiliary losses, already weighted means (undefined: none)
  at::Tensor terms;   // [terms, 2] float64: each term's (sum before its weight, count), detached; undefined without terms
  // sum / count plus aux: the batch's own mean loss (tests, a lone batch).
  at::Tensor mean() const;
};

class Objective {
 public:
  // chunk_tokens > 0: the head's logits this many tokens at a time, fused with the cross-entropy
  // (chunked_cross_entropy.h); 0: all logits at once, then the cross-entropy.
  explicit Objective(int64_t chunk_tokens = 0) : chunk_tokens_(chunk_tokens) {}
  // A token-summed term from the model's hidden states and the batch, added with `weight`.
  using Term = std::function<TermValue(const CausalLM& model, const CausalLM::Hidden& hidden, const data::Batch& batch)>;
  // `name` is the term's own ("mtp_1"); `metric` the one it is logged under ("mtp_loss").
  void add_term(std::string name, std::string metric, double weight, Term term);
  // A term's weight from now on (a schedule: MTP's lambda); throws for a name never added.
  void set_weight(const std::string& name, double weight);
  // Replaces the cross-entropy with a loss over the batch's pairs (the value's count is batch.pairs);
  // its metrics are logged as terms of weight 0, before any other term.
  using SequenceLoss = std::function<SequenceLossValue(const CausalLM& model, const CausalLM::Hidden& hidden, const data::Batch& batch)>;
  void set_sequence_loss(std::vector<std::string> metrics, SequenceLoss loss);
  size_t num_terms() const { return sequence_metrics_.size() + terms_.size(); }
  int64_t chunk_tokens() const { return chunk_tokens_; }
  // The metrics of the terms, in order; a metric's terms are adjacent, each one of its values.
  std::vector<MetricShape> metrics() const;
  // The cross-entropy alone (evaluation's objective).
  Objective cross_entropy_only() const { return Objective(chunk_tokens_); }
  // One forward through `model` on `batch` (on the model's device): positions and, when the
  // batch cuts documents, attention within them.
  ObjectiveValue operator()(const CausalLM& model, const data::Batch& batch) const;
  // The same from hidden states already computed (a pipeline's last stage: CausalLM::run_groups).
  ObjectiveValue of_hidden(const CausalLM& model, const CausalLM::Hidden& hidden, const data::Batch& batch) const;

 private:
  struct Weighted {
    std::string name, metric;
    double weight;
    Term term;
  };
  int64_t chunk_tokens_;
  std::vector<Weighted> terms_;
  std::vector<std::string> sequence_metrics_;
  SequenceLoss sequence_loss_;
};

}  // namespace dstrain::model
