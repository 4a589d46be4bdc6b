#pragma once
// Pipeline parallelism's training step (parallel.pipeline_parallel_size P > 1). Ranks are laid
// out stage-major: rank = pipeline rank x D + data-parallel index, D = world / P. Pipeline rank r
// holds stages r, r + P, ... of the P x v (each a range of layer groups, cost::stage_layers),
// built into one model (model::HeldGroups, global names) that its ZeRO engine shards over the
// stage's D data-parallel ranks, communicating at step boundaries only
// (EngineOptions::step_boundary_comm). Every pipeline rank of a data-parallel index reads the
// same micro-batches (the first stage their tokens, the last their labels, every stage the
// positions and document masks) and runs its actions of the schedule for the step's micro-batch
// count through pipeline_exec::Executor (the pipeline's plan: pipeline/schedule.h). The losses
// are the sequential runner's (loss_share.h): the last stage's divided by the step's units
// summed over the data-parallel group (the same number on every stage), the MoE auxiliary
// losses of any stage weighted by the micro-batch's share of them (a middle stage's go back as
// a side loss), all times the engine's loss scale. Sums stay on the device (StepTotals).
#include <memory>
#include <string>
#include <vector>

#include "dstrain/model/causal_lm.h"
#include "dstrain/train/step_runner.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::comm {
class Communicator;
}
namespace dstrain::model {
class Objective;
}
namespace dstrain::zero {
class Engine;
}

namespace dstrain::train {

// The layer groups of stage s of the recipe's p x v, as LayerGate numbers them.
model::GroupRange stage_groups(const config::Recipe& recipe, int stage);
// The stages pipeline rank r holds: r, r + p, ...; their layer groups.
std::vector<int> pipeline_rank_stages(const config::Recipe& recipe, int pipeline_rank);
model::HeldGroups pipeline_rank_groups(const config::Recipe& recipe, int pipeline_rank);
// "stage 1 (layers 2-3, the final norm and head)", for the start-up log.
std::string describe_stage(const config::Recipe& recipe, int stage);

class PipelineRunner final : public StepRunner {
 public:
  // `model` holds pipeline_rank_groups(recipe, pipeline_group.rank()); `engine` trains it with
  // step_boundary_comm. Everything is borrowed.
  PipelineRunner(const config::Recipe& recipe, const model::CausalLM& model, const model::Objective& objective, zero::Engine& engine,
                 comm::Communicator& pipeline_group, const c10::Device& device);
  ~PipelineRunner() override;
  void add_observer(MicroBatchObserver* observer) override;
  // One step: this data-parallel rank's micro-batches through every stage. The loss: this
  // rank's part of the step's loss (its stages' terms; summed over every rank: the step's loss).
  StepTotals train(const std::vector<data::Batch>& batches, int64_t global_units) override;
  // Forwards only, without gradients (evaluation): the cross-entropy sums of the micro-batches on
  // the ranks of the last stage, zero elsewhere. No observer sees them. Collective over the
  // pipeline (and, at ZeRO-3, the stage's data-parallel group).
  StepTotals forward(const std::vector<data::Batch>& batches) override;
  StepTotals forward_with(const model::Objective& objective, const std::vector<data::Batch>& batches) override;
  // Two micro-batches per pipeline rank keep the forward-only schedule's stages busy.
  int64_t forward_batches() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::train
