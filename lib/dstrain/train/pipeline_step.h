#pragma once
// Pipeline parallelism's training step (parallel.pipeline_parallel_size P > 1). Ranks are laid
// out stage-major: rank = pipeline rank x D + data-parallel index, D = world / P. Pipeline rank r
// holds stages r, r + P, ... of the P x v (each a range of layer groups, config::stage_layers),
// built into one model (model::HeldGroups, global names) that its ZeRO engine shards over the
// stage's D data-parallel ranks, communicating at step boundaries only
// (EngineOptions::step_boundary_comm). Every pipeline rank of a data-parallel index reads the
// same micro-batches (the first stage their tokens, the last their labels, every stage the
// positions and document masks) and runs its actions of the schedule for the step's micro-batch
// count through pipeline_run::Executor. The losses are the sequential schedule's
// (MicroBatchSchedule): the last stage's divided by the step's units summed over the
// data-parallel group (the same number on every stage), the MoE auxiliary losses of any stage
// weighted by the micro-batch's share of them (a middle stage's go back as a side loss), all
// times the engine's loss scale.
#include <memory>
#include <string>
#include <vector>

#include "dstrain/model/causal_lm.h"
#include "dstrain/train/micro_batch_schedule.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::comm {
class Communicator;
}

namespace dstrain::train {

// The layer groups of stage s of the recipe's p x v, as LayerGate numbers them.
model::GroupRange stage_groups(const config::Recipe& recipe, int stage);
// The stages pipeline rank r holds: r, r + p, ...; their layer groups.
std::vector<int> pipeline_rank_stages(const config::Recipe& recipe, int pipeline_rank);
model::HeldGroups pipeline_rank_groups(const config::Recipe& recipe, int pipeline_rank);
// "stage 1 (layers 2-3, the final norm and head)", for the start-up log.
std::string describe_stage(const config::Recipe& recipe, int stage);

class PipelineStep {
 public:
  // `model` holds pipeline_rank_groups(recipe, pipeline_group.rank()); `engine` trains it with
  // step_boundary_comm. Everything is borrowed.
  PipelineStep(const config::Recipe& recipe, const model::CausalLM& model, const model::Loss& loss, zero::Engine& engine,
               comm::Communicator& pipeline_group, const c10::Device& device);
  ~PipelineStep();
  void add_observer(MicroBatchObserver* observer);
  // One step: this data-parallel rank's micro-batches through every stage. loss: this rank's
  // part of the step's loss (its stages' terms; summed over every rank: the step's loss).
  ScheduleResult run(const std::vector<data::Batch>& batches, int64_t global_units);
  // Forwards only, without gradients (evaluation): token_loss and trained_targets of the
  // micro-batches on the ranks of the last stage, zero elsewhere. No observer sees them.
  // Collective over the pipeline (and, at ZeRO-3, the stage's data-parallel group).
  ScheduleResult forward_only(const std::vector<data::Batch>& batches);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::train
