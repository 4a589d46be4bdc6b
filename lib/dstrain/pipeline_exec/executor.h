#pragma once
// Runs one pipeline rank's part of a schedule (pipeline/schedule.h) for a step: its stages'
// forwards and backwards in the schedule's order, activations and gradients sent to and received
// from the neighbouring pipeline ranks through a Communicator (Gloo on a CPU, NCCL on a GPU; the
// schedule receives each link's messages in send order, which NCCL needs). Sends are posted and
// waited for by the end of the step (those done sooner released before each action); a sent
// output keeps only its graph (Megatron's deallocate_output_tensor), and a stage's graph is freed
// once its backward has run. Each action tells the heartbeat its stage, micro-batch and, for a
// transfer, what it carries between which stages (core/progress.h); an error names the stage.
//
// This is the schedule's executor below the engine: a StageModule says what a stage computes
// (train/pipeline_runner.h: the model's layer groups, the loss on the last stage).
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::pipeline_exec {

// What a stage's forward of one micro-batch gives.
struct StageOutput {
  // The activations for the next stage, or on the last stage the micro-batch's loss (a scalar
  // whose backward starts from 1).
  at::Tensor output;
  // A scalar whose backward also starts from 1 on a stage that is not the last (MoE auxiliary
  // losses of its layers); undefined: none.
  at::Tensor side_loss;
};

// One stage's computation on this rank.
class StageModule {
 public:
  virtual ~StageModule() = default;
  // The forward of `micro_batch`: `input` the previous stage's activations (a leaf that requires
  // its gradient), undefined on the first stage, which reads its micro-batch itself.
  virtual StageOutput forward(int micro_batch, const at::Tensor& input) = 0;
  // The parameters whose gradients the weight-gradient pass (W) accumulates.
  virtual std::vector<at::Tensor> parameters() const = 0;
};

// The activations that flow between stages: one shape and type for every micro-batch, fixed by
// the config (no shape exchange per transfer).
struct Activation {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::ScalarType::Float;
  at::Device device = at::kCPU;
  // When set, each micro-batch's shape instead (known on every rank from its own copy of the
  // micro-batch, so still no exchange).
  std::function<std::vector<int64_t>(int micro_batch)> sizes_of;
};

// Where one rank's step went: its compute actions (F, B, I, W) and the whole schedule, the
// waits for its neighbours included. The bubble is what the schedule's time has over its compute.
struct StepTimes {
  double compute_ms = 0;
  double schedule_ms = 0;
};

class Executor {
 public:
  // `group`: the pipeline group (its rank r is pipeline rank r); `stages`: this rank's stages
  // (schedule.rank_of(s) == group rank), each outliving the executor.
  Executor(pipeline::Schedule schedule, comm::Communicator& group, std::map<int, StageModule*> stages, Activation activation);
  ~Executor();
  // Runs this rank's actions once; the parameters' .grad hold the step's sums afterwards. Returns
  // each micro-batch's loss on the rank holding the last stage, nothing elsewhere. A schedule of
  // forwards only (pipeline::forward_only_schedule, outputs without gradients) keeps nothing.
  std::vector<double> run_step();
  // The last run_step's.
  const StepTimes& times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::pipeline_exec
