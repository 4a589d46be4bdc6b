#pragma once
// The pipeline as a resolved config describes it (parallel.pipeline_parallel_size > 1): the
// rank layout, each stage's decoder layers (given, or balanced by training FLOPs), what each
// pipeline rank holds and computes, the schedule, its bubble and the memory it needs per rank.
// The checks on the pipeline keys are config's (config/pipeline_check.h).
#include <functional>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/stage_split.h"
#include "dstrain/pipeline/timeline.h"

namespace dstrain::cost {

// The decoder layers of each of the p x v stages, in order: pipeline.layers_per_stage, or
// balanced by training FLOPs (the embedding on the first stage, the head on the last).
std::vector<int> stage_layers(const Recipe& recipe);

struct StagePlan {
  int first_layer = 0, layers = 0;  // decoder layers [first_layer, first_layer + layers)
  bool embedding = false, head = false;
  bool mtp = false;       // the multi-token prediction modules (with the head)
  double parameters = 0;  // every parameter of the stage (all routed experts)
  double routed = 0;      // of which routed experts
  double flops_per_token = 0;
};

struct PipelineRankPlan {
  std::vector<int> stages;  // the stages it holds: r, r + p, ...
  double parameters = 0;    // held on each of its ranks (1 / expert_parallel_size of the routed experts)
  double flops_per_token = 0;
  double device_states = 0, host_states = 0, activations = 0;
  int peak_micro_batches = 0;  // stage micro-batches held at once (through the schedule's replay)
  double device_total() const { return device_states + activations; }
};

struct PipelinePlan {
  std::vector<StagePlan> stages;        // p x v
  std::vector<PipelineRankPlan> ranks;  // p
  pipeline::Schedule schedule;          // at the first step's accumulation
  pipeline::Timeline timeline;          // replayed on unit costs (F = I = W: a backward twice a forward)
};
// Requires a valid recipe with parallel.pipeline_parallel_size > 1.
PipelinePlan pipeline_plan(const Recipe& recipe);

// For --dry-run: the layout, the stages, the schedule and the memory per pipeline rank;
// `show_schedule` adds every rank's action list and a chart of the replay.
std::string pipeline_text(const Recipe& recipe, bool show_schedule);

}  // namespace dstrain::cost
