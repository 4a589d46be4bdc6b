#pragma once
// The validation loss of fixed evaluation sets (data/data_sources.h), on every rank at once:
//   samples (text windows or packed rows of conversations) dealt out in micro-batches,
//   micro-batch g to rank g % world, so each rank reads
//   about 1/world of each set; every rank runs the same number of forwards (a rank past the end
//   runs a batch whose labels are all ignored), as stage-3 gathers and expert all-to-alls need;
//   each forward goes through the training step's runner (StepRunner::forward: no autograd,
//   activation checkpointing recomputes nothing); the cross-entropy is summed over
//   trained targets (the MoE balance loss is not part of it) and the sums of every rank are added
//   in rank order: loss = sum of token losses / trained tokens, the same at any world size.
// It reads the weights only (no optimizer state), and leaves nothing behind that training sees:
// the MoE expert load it routed, the all-to-all and gather waits are discarded, no RNG is drawn.
// The micro-batches are dealt over the runner's data-parallel ranks; with pipeline parallelism
// every pipeline rank of one data-parallel index runs the same ones through its stages, a pass of
// runner.forward_batches() (2 x P: the bubble of one forward-only GPipe pass) at a time; the last
// stage's ranks hold the sums, the others add zeros. The sums are then those of the same
// data-parallel run without a pipeline, bit for bit.
// A set of preference pairs (train.objective dpo) is scored by the training objective instead
// (set_pair_objective: the DPO loss against the set's reference log-probs), micro-batches of pairs:
// loss = sum of pair losses / pairs, and each of the objective's metrics (rewards/accuracies, ...)
// its sum over its count, all ranks, as TRL's evaluate() reports them on one batch.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/data/data_sources.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
class CausalLM;
class Objective;
}  // namespace dstrain::model
namespace dstrain::zero {
class Engine;
}

namespace dstrain::train {

class LiveReference;
class StepRunner;

struct EvalResult {
  std::string name;
  double loss = 0;                                      // sum of token losses / tokens, all ranks
  double ppl = 0;                                       // exp(min(loss, 20)), Megatron's convention
  int64_t tokens = 0;                                   // trained targets evaluated, all ranks
  int64_t windows = 0;                                  // samples evaluated: windows of text, or packed rows of conversations
  int64_t conversations = 0;                            // a set of conversations: how many (0: text)
  int64_t pairs = 0;                                    // a set of preference pairs: how many (loss: per pair; no ppl, no tokens)
  std::vector<std::pair<std::string, double>> metrics;  // the pair objective's, by name
  double ms = 0;                                        // wall time of this set's evaluation
};

struct EvalOptions {
  int64_t micro_batch_size = 1;
  int64_t max_batches = 0;  // micro-batches per set over all ranks (the same samples at any world size); 0: the whole set
  // Pair sets' batches carry the set's chosen targets per pair (model::chosen_targets_counted):
  // of the completions, or with chosen_sequences of the whole chosen sequences.
  bool chosen_targets = false, chosen_sequences = false;
  // parallel.sequence_parallel_size: consecutive data-parallel ranks that share each row's tokens.
  int sequence_parallel = 1;
};

// The recipe's eval and data settings (eval.micro_batch_size 0: the training micro batch).
EvalOptions eval_options_from(const config::Recipe& recipe);

class Evaluator {
 public:
  // Everything but the sets is borrowed. engine: null when the model is not under one (dstrain
  // eval); runner: the forwards; data_parallel: the ranks the samples are dealt to (the runner's);
  // comm: every rank, which sums the results (Gloo's, on CPU).
  Evaluator(std::vector<data::EvalSet> sets, const EvalOptions& options, model::CausalLM& model, zero::Engine* engine, StepRunner& runner,
            comm::Communicator& data_parallel, comm::Communicator& comm);
  ~Evaluator();
  // Collective: every rank calls it at the same point.
  std::vector<EvalResult> evaluate();
  // The objective that scores sets of preference pairs (borrowed; the training step's).
  void set_pair_objective(const model::Objective* objective) { pair_objective_ = objective; }
  // preference.reference live: pair batches get their reference log-probs from it (nullptr: from the sets' tables).
  void set_live_reference(LiveReference* live) { live_reference_ = live; }
  const std::vector<data::EvalSet>& sets() const { return sets_; }
  // The forwards evaluate() runs on each rank, all sets together.
  int64_t rounds() const;
  // Called on every rank after each of a set's forwards with this rank's sums so far (dstrain
  // eval's progress bar).
  using Progress = std::function<void(const data::EvalSet& set, int64_t round, int64_t rounds, double token_loss, int64_t tokens)>;
  void set_progress(Progress progress) { progress_ = std::move(progress); }

 private:
  struct Plan {
    int64_t batches = 0, windows = 0, rounds = 0;
  };
  Plan plan(const data::EvalSet& set) const;
  EvalResult evaluate(const data::EvalSet& set, double chosen_targets_per_pair);
  std::vector<data::EvalSet> sets_;
  std::vector<double> chosen_targets_per_pair_;  // each set's, counted once (options_.chosen_targets; else 0)
  EvalOptions options_;
  model::CausalLM& model_;
  zero::Engine* engine_;
  StepRunner& runner_;
  comm::Communicator& data_parallel_;
  comm::Communicator& comm_;
  Progress progress_;
  const model::Objective* pair_objective_ = nullptr;
  LiveReference* live_reference_ = nullptr;
};

}  // namespace dstrain::train
