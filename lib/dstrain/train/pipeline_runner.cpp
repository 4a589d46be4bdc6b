#include "dstrain/train/pipeline_runner.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <optional>

#include "dstrain/comm/communicator.h"
#include "dstrain/cost/pipeline_plan.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline_exec/executor.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {

model::GroupRange stage_groups(const config::Recipe& recipe, int stage) {
  const std::vector<int> layers = cost::stage_layers(recipe);
  if (stage < 0 || static_cast<size_t>(stage) >= layers.size())
    throw Error(ErrorCode::kInternal, fmt::format("pipeline stage {} of {}", stage, layers.size()));
  int first_layer = 0;
  for (int s = 0; s < stage; ++s) first_layer += layers[static_cast<size_t>(s)];
  const int final_group = static_cast<int>(recipe.model.num_layers) + 1;
  model::GroupRange r;
  r.first = stage == 0 ? 0 : first_layer + 1;
  r.last = static_cast<size_t>(stage) + 1 == layers.size() ? final_group : first_layer + layers[static_cast<size_t>(stage)];
  return r;
}

std::vector<int> pipeline_rank_stages(const config::Recipe& recipe, int pipeline_rank) {
  const int p = static_cast<int>(recipe.parallel.pipeline_parallel_size), stages = p * static_cast<int>(recipe.pipeline.virtual_stages);
  std::vector<int> mine;
  for (int s = pipeline_rank; s < stages; s += p) mine.push_back(s);
  return mine;
}

model::HeldGroups pipeline_rank_groups(const config::Recipe& recipe, int pipeline_rank) {
  model::HeldGroups held;
  for (int s : pipeline_rank_stages(recipe, pipeline_rank)) held.push_back(stage_groups(recipe, s));
  return held;
}

std::string describe_stage(const config::Recipe& recipe, int stage) {
  const model::GroupRange g = stage_groups(recipe, stage);
  const int layers = static_cast<int>(recipe.model.num_layers);
  std::vector<std::string> parts;
  if (g.first == 0) parts.push_back("the embedding");
  const int first_layer = std::max(g.first, 1) - 1, last_layer = std::min(g.last, layers) - 1;
  if (first_layer == last_layer) parts.push_back(fmt::format("layer {}", first_layer));
  if (first_layer < last_layer) parts.push_back(fmt::format("layers {}-{}", first_layer, last_layer));
  if (g.last == layers + 1) parts.push_back(recipe.model.mtp_depth > 0 ? "the final norm, head and MTP" : "the final norm and head");
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i == 0 ? "" : ", ") + parts[i];
  return fmt::format("stage {} ({})", stage, text);
}

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// What every stage of this rank reads during one step.
struct StepInputs {
  std::vector<data::Batch> host, device;  // the micro-batches
  double global = 1;                      // the step's loss units over the data-parallel group
  double loss_scale = 1;
  std::optional<TotalsAccumulator> sums;  // this rank's terms of the step's loss (unscaled), its cross-entropy and terms
  double forward_ms = 0;
  bool evaluating = false;  // forwards only: the cross-entropy sums, no loss terms, no observers
};

// With multi-token prediction, a training step's activations between stages carry the
// embeddings' output beside the hidden states ([B, T, 2H]: hidden first): the last stage's MTP
// modules read it, and its gradient flows back through every stage into the one embedding, so
// no stage holds a copy of it. Evaluation computes no MTP and sends [B, T, H].
class ModelStage final : public pipeline_exec::StageModule {
 public:
  ModelStage(const model::CausalLM& model, const model::Objective& objective, const config::Recipe& recipe, model::GroupRange groups,
             const std::vector<MicroBatchObserver*>& observers, StepInputs& step)
      : model_(model), objective_(objective), cross_entropy_(objective.cross_entropy_only()),
        normalization_(recipe.train.loss_normalization), hidden_size_(recipe.model.hidden_size), mtp_(recipe.model.mtp_depth > 0),
        groups_(groups), observers_(observers), step_(step) {
    for (size_t i = 0; i < model.parameters().size(); ++i) {  // the ones backward computes gradients for (frozen ones have none)
      const model::ParamPlace& place = model.parameter_places()[i];
      if (place.trains && place.group >= groups.first && place.group <= groups.last) params_.push_back(model.parameters()[i].tensor);
    }
  }

  pipeline_exec::StageOutput forward(int mb, const at::Tensor& input) override {
    const auto t0 = Clock::now();
    progress::enter(progress::Phase::kForward);
    const data::Batch& batch = step_.device.at(static_cast<size_t>(mb));
    const bool carries = mtp_ && !step_.evaluating;
    model::CausalLM::Input in = model::input_of(batch);
    at::Tensor x = input;
    if (carries && x.defined()) in.embedded = x.narrow(-1, hidden_size_, hidden_size_), x = x.narrow(-1, 0, hidden_size_);
    const model::CausalLM::Hidden h = model_.run_groups(groups_.first, groups_.last, x, in);
    const data::Batch& host = step_.host[static_cast<size_t>(mb)];
    pipeline_exec::StageOutput out;
    if (groups_.last != model_.final_group()) {
      out.output = carries ? at::cat({h.hidden, groups_.first == 0 ? h.embedded : in.embedded}, -1) : h.hidden;
      if (h.aux.defined() && !step_.evaluating) {
        const at::Tensor aux = aux_share(h.aux, host, normalization_, step_.global);
        step_.sums->add_loss(aux), out.side_loss = aux * step_.loss_scale;
      }
      step_.forward_ms += ms_since(t0);
      return out;
    }
    if (step_.evaluating) {
      const model::ObjectiveValue value = cross_entropy_.of_hidden(model_, h, batch);
      step_.sums->add_value(value);
      out.output = value.sum.detach();
      return out;
    }
    const model::ObjectiveValue value = objective_.of_hidden(model_, h, batch);
    const LossShare share = loss_share(value, host, normalization_, step_.global);
    at::Tensor loss = share.loss;
    for (MicroBatchObserver* o : observers_) loss = o->on_loss(static_cast<size_t>(mb), loss);
    step_.sums->add_loss(share.reported(loss));
    step_.sums->add_value(value);
    out.output = step_.loss_scale == 1.0 ? loss : loss * step_.loss_scale;
    step_.forward_ms += ms_since(t0);
    return out;
  }

  std::vector<at::Tensor> parameters() const override { return params_; }

 private:
  const model::CausalLM& model_;
  const model::Objective& objective_;
  const model::Objective cross_entropy_;  // evaluation's
  config::LossNormalization normalization_;
  int64_t hidden_size_;
  bool mtp_;
  model::GroupRange groups_;
  const std::vector<MicroBatchObserver*>& observers_;
  StepInputs& step_;
  std::vector<at::Tensor> params_;
};

}  // namespace

struct PipelineRunner::Impl {
  const config::Recipe& recipe;
  const model::CausalLM& model;
  zero::Engine& engine;
  comm::Communicator& group;
  c10::Device device;
  std::vector<MicroBatchObserver*> observers;
  size_t terms = 0;  // the objective's
  StepInputs step;
  std::map<int, std::unique_ptr<ModelStage>> stages;                     // this rank's, by stage index
  std::map<int64_t, std::unique_ptr<pipeline_exec::Executor>> runs;      // by micro-batches per step
  std::map<int64_t, std::unique_ptr<pipeline_exec::Executor>> forwards;  // forwards only, by micro-batches

  Impl(const config::Recipe& r, const model::CausalLM& m, zero::Engine& e, comm::Communicator& g, const c10::Device& d)
      : recipe(r), model(m), engine(e), group(g), device(d) {}

  pipeline_exec::Executor& executor(int64_t micro_batches, bool forwards_only = false) {
    auto& slot = (forwards_only ? forwards : runs)[micro_batches];
    if (slot) return *slot;
    const int p = group.world_size(), v = static_cast<int>(recipe.pipeline.virtual_stages), m = static_cast<int>(micro_batches);
    pipeline::Schedule schedule =
        forwards_only ? pipeline::forward_only_schedule(p, v, m) : pipeline::build_schedule(recipe.pipeline.schedule, p, v, m);
    std::map<int, pipeline_exec::StageModule*> mine;
    for (auto& [s, stage] : stages) mine[s] = stage.get();
    pipeline_exec::Activation activation;
    activation.dtype = model::scalar_type(recipe.precision.dtype);
    activation.device = device;
    const int64_t width = recipe.model.hidden_size * (recipe.model.mtp_depth > 0 && !forwards_only ? 2 : 1);  // ModelStage's
    activation.sizes_of = [this, width](int mb) {
      const data::Batch& b = step.host.at(static_cast<size_t>(mb));
      return std::vector<int64_t>{b.rows(), b.length(), width};
    };
    slot = std::make_unique<pipeline_exec::Executor>(std::move(schedule), group, std::move(mine), std::move(activation));
    return *slot;
  }
};

PipelineRunner::PipelineRunner(const config::Recipe& recipe, const model::CausalLM& model, const model::Objective& objective,
                               zero::Engine& engine, comm::Communicator& pipeline_group, const c10::Device& device)
    : impl_(std::make_unique<Impl>(recipe, model, engine, pipeline_group, device)) {
  const int p = static_cast<int>(recipe.parallel.pipeline_parallel_size), r = pipeline_group.rank();
  if (pipeline_group.world_size() != p)
    throw Error(ErrorCode::kInternal,
                fmt::format("a pipeline group of {} ranks for parallel.pipeline_parallel_size {}", pipeline_group.world_size(), p));
  impl_->terms = objective.num_terms();
  for (int s : pipeline_rank_stages(recipe, r))
    impl_->stages[s] = std::make_unique<ModelStage>(model, objective, recipe, stage_groups(recipe, s), impl_->observers, impl_->step);
}

PipelineRunner::~PipelineRunner() = default;

int64_t PipelineRunner::forward_batches() const { return 2 * static_cast<int64_t>(impl_->group.world_size()); }

void PipelineRunner::add_observer(MicroBatchObserver* observer) { impl_->observers.push_back(observer); }

namespace {

// A step's (or evaluation pass's) inputs, fresh: the batches on the host and on the device.
void start_step(StepInputs& step, const std::vector<data::Batch>& batches, const c10::Device& device, size_t terms, bool evaluating) {
  step = StepInputs{};
  step.evaluating = evaluating;
  step.host = batches;
  for (const data::Batch& b : batches) step.device.push_back(b.to(device));
  step.sums.emplace(evaluating ? 0 : terms, device);
}

}  // namespace

StepTotals PipelineRunner::train(const std::vector<data::Batch>& batches, int64_t global_units) {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  StepInputs& step = m.step;
  start_step(step, batches, m.device, m.terms, /*evaluating=*/false);
  step.global = static_cast<double>(std::max<int64_t>(global_units, 1));
  step.loss_scale = m.engine.loss_scale();
  for (MicroBatchObserver* o : m.observers) o->before_micro(0);
  // One reduction state for the whole step: stage 3 gathers the parameters here, and every
  // stage reduces its gradients once the schedule's last backward has run.
  const zero::MicroBatch reduction = m.engine.begin_micro(/*last=*/true);
  pipeline_exec::Executor& executor = m.executor(static_cast<int64_t>(batches.size()));
  executor.run_step();
  progress::enter(progress::Phase::kBackward);
  m.engine.end_micro(reduction);
  for (MicroBatchObserver* o : m.observers) o->after_backward(0);
  MicroTiming timing;
  timing.forward_ms = step.forward_ms;
  timing.backward_ms = ms_since(t0) - step.forward_ms;
  for (const data::Batch& b : batches) timing.rows += b.rows();
  for (MicroBatchObserver* o : m.observers) o->timed(0, timing);
  StepTotals out = step.sums->take();
  out.pipeline_compute_ms = executor.times().compute_ms, out.pipeline_schedule_ms = executor.times().schedule_ms;
  return out;
}

StepTotals PipelineRunner::forward(const std::vector<data::Batch>& batches) {
  Impl& m = *impl_;
  c10::NoGradGuard no_grad;
  start_step(m.step, batches, m.device, 0, /*evaluating=*/true);
  m.engine.gather_for_forward();
  m.executor(static_cast<int64_t>(batches.size()), /*forwards_only=*/true).run_step();
  m.engine.release_after_forward();
  return m.step.sums->take();
}

StepTotals PipelineRunner::forward_with(const model::Objective&, const std::vector<data::Batch>&) {
  throw Error(ErrorCode::kInternal, "a pipeline runs its forwards through the training objective only", "report this as a bug");
}

}  // namespace dstrain::train
