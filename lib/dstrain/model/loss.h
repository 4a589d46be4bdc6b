#pragma once
// The training objective, outside the models: a model gives its final hidden states
// (CausalLM::hidden_states) and the loss turns them into token-summed terms with the count of
// targets they cover. The schedule (train/micro_batch_schedule.h) divides by the global count of
// trained targets, so every micro-batch of every rank weighs by what it trains, masks included.
//   next-token cross-entropy  always: the head's logits (chunked, fused with the cross-entropy,
//                             when chunk_tokens > 0) against the batch's labels
//   further terms             add_term(): any number, each token-summed and weighted, computed
//                             from the same hidden states (multi-token prediction, distillation)
//   auxiliary                 the model's own (MoE balance), already a mean
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

using data::kIgnoreIndex;

// An added term's value on one batch: token-summed, and the targets it covers (a scalar tensor,
// so that counting needs no synchronisation; with per-target weights, their sum).
struct TermValue {
  at::Tensor sum, count;
};

struct LossParts {
  at::Tensor sum;     // token-summed: the cross-entropy over trained targets plus each added term x its weight (a scalar with grad)
  at::Tensor main;    // the cross-entropy alone, token-summed (detached): what the run reports as its loss
  int64_t count = 0;  // the batch's trained targets
  at::Tensor aux;     // the model's auxiliary losses, already weighted means (undefined: none)
  std::vector<TermValue> terms;  // each added term's own value (detached, before its weight), in add_term's order
  // sum / count plus aux: the batch's own mean loss (tests, a lone batch).
  at::Tensor mean() const;
};

class Loss {
 public:
  // chunk_tokens > 0: the head's logits this many tokens at a time, fused with the cross-entropy
  // (chunked_cross_entropy.h); 0: all logits at once, then the cross-entropy.
  explicit Loss(int64_t chunk_tokens = 0) : chunk_tokens_(chunk_tokens) {}
  // A token-summed term from the model's hidden states and the batch, added with `weight`.
  using Term = std::function<TermValue(const CausalLM& model, const CausalLM::Hidden& hidden, const data::Batch& batch)>;
  void add_term(std::string name, double weight, Term term);
  // A term's weight from now on (a schedule: MTP's λ); throws for a name never added.
  void set_weight(const std::string& name, double weight);
  size_t num_terms() const { return terms_.size(); }
  int64_t chunk_tokens() const { return chunk_tokens_; }
  // One forward through `model` on `batch` (on the model's device): positions and, when the
  // batch cuts documents, attention within them.
  LossParts operator()(const CausalLM& model, const data::Batch& batch) const;
  // The same from hidden states already computed (a pipeline's last stage: CausalLM::run_groups).
  LossParts of_hidden(const CausalLM& model, const CausalLM::Hidden& hidden, const data::Batch& batch) const;

 private:
  struct Weighted {
    std::string name;
    double weight;
    Term term;
  };
  int64_t chunk_tokens_;
  std::vector<Weighted> terms_;
};

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
