#include "dstrain/train/evaluator.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/train/micro_batch_schedule.h"
#include "dstrain/train/pipeline_step.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {

EvalOptions eval_options_from(const config::Recipe& recipe) {
  EvalOptions o;
  o.micro_batch_size = recipe.eval.micro_batch_size > 0 ? recipe.eval.micro_batch_size : recipe.train.micro_batch_size;
  o.max_batches = recipe.eval.max_batches;
  o.windows.eos_token = recipe.data.eos_token;
  o.windows.document_mask = recipe.data.document_mask;
  o.windows.reset_positions = recipe.data.reset_positions;
  o.windows.vocab_size = recipe.model.vocab_size;
  return o;
}

Evaluator::Evaluator(std::vector<EvalSet> sets, const EvalOptions& options, model::CausalLM& model, zero::Engine* engine,
                     comm::Communicator& comm, const c10::Device& device, int64_t loss_chunk_tokens)
    : sets_(std::move(sets)), options_(options), model_(model), engine_(engine), comm_(comm),
      loss_(std::make_unique<model::Loss>(loss_chunk_tokens)),
      // Its own schedule, without the trainer's observers: the balancer and telemetry never see it.
      schedule_(std::make_unique<MicroBatchSchedule>(model, *loss_, nullptr, device)) {}

Evaluator::~Evaluator() = default;

void Evaluator::use_pipeline(PipelineStep& step, comm::Communicator& data_parallel, int pipeline_ranks) {
  pipeline_ = &step, data_parallel_ = &data_parallel;
  pass_ = 2 * static_cast<int64_t>(pipeline_ranks);
}

std::vector<EvalResult> Evaluator::evaluate() {
  std::vector<EvalResult> results;
  for (const EvalSet& set : sets_) results.push_back(evaluate(set));
  // What the forwards left for training's step: the routed expert load (the bias would move by
  // it) and the waits on all-to-alls and gathers (the next step's timing).
  model_.take_expert_load();
  model_.take_all_to_all_wait_ms();
  if (engine_) engine_->discard_wait_times();
  return results;
}

Evaluator::Plan Evaluator::plan(const EvalSet& set) const {
  const int64_t world = (data_parallel_ ? *data_parallel_ : comm_).world_size(), micro = options_.micro_batch_size;
  Plan p;
  p.batches = (set.samples() + micro - 1) / micro;  // micro-batches over all ranks: the same at any world size
  if (options_.max_batches > 0) p.batches = std::min(p.batches, options_.max_batches);
  p.windows = std::min(set.samples(), p.batches * micro);
  p.rounds = (p.batches + world - 1) / world;
  return p;
}

int64_t Evaluator::rounds() const {
  int64_t n = 0;
  for (const EvalSet& set : sets_) n += plan(set).rounds;
  return n;
}

EvalResult Evaluator::evaluate(const EvalSet& set) {
  const auto t0 = std::chrono::steady_clock::now();
  c10::NoGradGuard no_grad;
  const comm::Communicator& dealt = data_parallel_ ? *data_parallel_ : comm_;
  const int64_t world = dealt.world_size(), rank = dealt.rank();
  const int64_t micro = options_.micro_batch_size;
  const Plan planned = plan(set);
  const int64_t windows = planned.windows, rounds = planned.rounds;
  // Past the planned samples (max_batches, the set's end): rows of the same shape that train nothing.
  auto batch_of = [&](int64_t round) { return set.batch((round * world + rank) * micro, micro, windows, options_.windows); };
  double token_loss = 0;
  int64_t tokens = 0;
  for (int64_t round = 0; round < rounds;) {
    ScheduleResult r;
    int64_t done = round + 1;
    if (pipeline_) {
      std::vector<data::Batch> pass;
      for (done = round; done < rounds && done < round + pass_; ++done) pass.push_back(batch_of(done));
      r = pipeline_->forward_only(pass);
    } else {
      const data::Batch batch = batch_of(round);
      r = schedule_->run({batch}, std::max<int64_t>(batch.trained_targets, 1), /*backward=*/false);
    }
    round = done;
    token_loss += r.token_loss;
    tokens += r.trained_targets;
    if (progress_) progress_(set, round, rounds, token_loss, tokens);
  }
  const std::vector<double> sums = comm::sum_in_rank_order(comm_, {token_loss, static_cast<double>(tokens)});
  EvalResult result;
  result.name = set.name();
  result.tokens = static_cast<int64_t>(std::llround(sums[1]));
  result.loss = sums[0] / static_cast<double>(std::max<int64_t>(result.tokens, 1));
  result.ppl = std::exp(std::min(result.loss, 20.0));
  result.windows = windows;
  result.conversations = set.conversations_in(windows);
  result.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace dstrain::train
