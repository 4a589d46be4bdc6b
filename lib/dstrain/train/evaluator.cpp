#include "dstrain/train/evaluator.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/core/error.h"
#include "dstrain/data/sequence_shard.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "dstrain/train/live_reference.h"
#include "dstrain/train/step_runner.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {

EvalOptions eval_options_from(const config::Recipe& recipe) {
  EvalOptions o;
  o.micro_batch_size = recipe.eval.micro_batch_size > 0 ? recipe.eval.micro_batch_size : recipe.train.micro_batch_size;
  o.max_batches = recipe.eval.max_batches;
  const model::ChosenTargets counted = model::chosen_targets_counted(recipe.train.objective, recipe.preference);
  o.chosen_targets = counted != model::ChosenTargets::kNone;
  o.chosen_sequences = counted == model::ChosenTargets::kSequences;
  o.sequence_parallel = static_cast<int>(std::max<int64_t>(1, recipe.parallel.sequence_parallel_size));
  return o;
}

Evaluator::Evaluator(std::vector<data::EvalSet> sets, const EvalOptions& options, model::CausalLM& model, zero::Engine* engine,
                     StepRunner& runner, comm::Communicator& data_parallel, comm::Communicator& comm)
    : sets_(std::move(sets)), options_(options), model_(model), engine_(engine), runner_(runner), data_parallel_(data_parallel),
      comm_(comm) {
  // A token mean over a set's chosen completions enters as a sum over its pairs: the count is the
  // set's, the same at every evaluation.
  for (const data::EvalSet& set : sets_) {
    const int64_t windows = plan(set).windows;
    if (!options_.chosen_targets || !set.pairs() || windows <= 0) {
      chosen_targets_per_pair_.push_back(0.0);
      continue;
    }
    const int64_t targets = options_.chosen_sequences
                                ? static_cast<const data::PreferencePairs&>(set.source()).chosen_sequence_targets_in(windows)
                                : set.source().chosen_targets_in(windows);
    chosen_targets_per_pair_.push_back(static_cast<double>(targets) / static_cast<double>(windows));
  }
}

Evaluator::~Evaluator() = default;

std::vector<EvalResult> Evaluator::evaluate() {
  std::vector<EvalResult> results;
  for (size_t i = 0; i < sets_.size(); ++i) results.push_back(evaluate(sets_[i], chosen_targets_per_pair_[i]));
  // What the forwards left for training's step: the routed expert load (the bias would move by
  // it) and the waits on all-to-alls and gathers (the next step's timing).
  model_.take_expert_load();
  model_.take_all_to_all_wait_ms();
  if (engine_) engine_->discard_wait_times();
  return results;
}

Evaluator::Plan Evaluator::plan(const data::EvalSet& set) const {
  const int64_t world = data_parallel_.world_size() / options_.sequence_parallel, micro = options_.micro_batch_size;
  Plan p;
  p.batches = (set.samples() + micro - 1) / micro;  // micro-batches over all ranks: the same at any world size
  if (options_.max_batches > 0) p.batches = std::min(p.batches, options_.max_batches);
  p.windows = std::min(set.samples(), p.batches * micro);
  p.rounds = (p.batches + world - 1) / world;
  return p;
}

int64_t Evaluator::rounds() const {
  int64_t n = 0;
  for (const data::EvalSet& set : sets_) n += plan(set).rounds;
  return n;
}

EvalResult Evaluator::evaluate(const data::EvalSet& set, double chosen_targets_per_pair) {
  const auto t0 = std::chrono::steady_clock::now();
  c10::NoGradGuard no_grad;
  // A sequence group's ranks read the same rows, each its share of their tokens.
  const int s = options_.sequence_parallel;
  const int64_t world = data_parallel_.world_size() / s, rank = data_parallel_.rank() / s, pass = runner_.forward_batches();
  const int64_t micro = options_.micro_batch_size;
  const Plan planned = plan(set);
  if (set.pairs() && !pair_objective_)
    throw Error(ErrorCode::kInternal, fmt::format("the evaluation set {} holds preference pairs, and nothing scores them", set.name()),
                "report this as a bug");
  const int64_t windows = planned.windows, rounds = planned.rounds;
  // Past the planned samples (max_batches, the set's end): rows of the same shape that train nothing.
  auto batch_of = [&](int64_t round) {
    data::Batch b = data::sequence_shard(set.batch((round * world + rank) * micro, micro, windows), {data_parallel_.rank() % s, s});
    b.chosen_targets_per_pair = chosen_targets_per_pair;
    return b;
  };
  double token_loss = 0;
  int64_t tokens = 0;  // trained targets; pairs for a set of pairs
  std::vector<double> term_sums, term_counts;
  for (int64_t round = 0; round < rounds;) {
    std::vector<data::Batch> batches;
    int64_t done = round;
    for (; done < rounds && done < round + pass; ++done) batches.push_back(batch_of(done));
    if (set.pairs() && live_reference_) live_reference_->fill(batches);
    const HostTotals r =  // one read per pass
        read_totals(set.pairs() ? runner_.forward_with(*pair_objective_, batches) : runner_.forward(batches));
    round = done;
    token_loss += r.token_loss;
    tokens += r.trained_targets;
    term_sums.resize(r.term_sums.size()), term_counts.resize(r.term_counts.size());
    for (size_t t = 0; t < r.term_sums.size(); ++t) term_sums[t] += r.term_sums[t], term_counts[t] += r.term_counts[t];
    if (progress_) progress_(set, round, rounds, token_loss, tokens);
  }
  // Every rank ran the same objective: its terms' sums and counts line up (zeros where a rank had no pass).
  const size_t terms = set.pairs() ? pair_objective_->num_terms() : 0;
  term_sums.resize(terms), term_counts.resize(terms);
  std::vector<double> mine{token_loss, static_cast<double>(tokens)};
  mine.insert(mine.end(), term_sums.begin(), term_sums.end());
  mine.insert(mine.end(), term_counts.begin(), term_counts.end());
  const std::vector<double> sums = comm::sum_in_rank_order(comm_, mine);
  EvalResult result;
  result.name = set.name();
  const int64_t counted = static_cast<int64_t>(std::llround(sums[1]));
  result.loss = sums[0] / static_cast<double>(std::max<int64_t>(counted, 1));
  if (set.pairs()) {
    result.pairs = counted;
    result.ppl = std::numeric_limits<double>::quiet_NaN();
    size_t t = 0;
    for (const model::MetricShape& m : pair_objective_->metrics())
      for (size_t k = 0; k < m.values; ++k, ++t)
        result.metrics.emplace_back(m.values == 1 ? m.name : fmt::format("{}_{}", m.name, k + 1),
                                    sums[2 + terms + t] > 0 ? sums[2 + t] / sums[2 + terms + t] : 0.0);
  } else {
    result.tokens = counted;
    result.ppl = std::exp(std::min(result.loss, 20.0));
  }
  result.windows = windows;
  result.conversations = set.conversations_in(windows);
  result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace dstrain::train
