#pragma once
// One rank's training, from the resolved config to the last step: THE loop.
//   Trainer(env, device)  the config, communicators, heartbeat, preflight env check, model, data,
//                         the ZeRO engine, the checkpointer (and the resume), telemetry
//   run()                 step() until the last step or a coordinated stop
//   step()                batches -> the global trained-target count -> the step runner
//                         (forward, objective, backward) -> engine step with every rank's StepSignals
//                         (and the MoE bias) -> bad-step policy -> shard balance -> metrics ->
//                         evaluation (eval.*: the validation loss, best checkpoint, early
//                         stopping) -> checkpoint / stop
// Everything with depth lives in the collaborators: DataPlan and ShardBalancer (data_plan.h),
// StepTriggers (step_triggers.h), BadStepPolicy (bad_step_policy.h), Checkpointer, Telemetry,
// zero::Engine.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/train/eval_tracker.h"

namespace dstrain::run {
struct WorkerEnv;
}
namespace dstrain::device {
struct TrainingDevice;
}
namespace dstrain::zero {
struct StepResult;
}

namespace dstrain::train {

struct StepSignals;
struct StepOutcome;
struct StepTotals;
struct HostTotals;

class Trainer {
 public:
  // Collective: every rank constructs its Trainer at the same point.
  Trainer(const run::WorkerEnv& env, const device::TrainingDevice& device);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to the last step (0) or to a coordinated stop with a checkpoint (exit_status::kStopped),
  // then shuts down (below).
  int run();
  // The worker's end, in order: data prefetch, checkpoint writer (its error, if any, is thrown),
  // telemetry files, heartbeat (a last "finished" beat); the device synchronized; engine, model
  // and buffers freed; NCCL then Gloo communicators destroyed; the CUDA allocator's cache
  // returned. Runs once; the destructor runs it quietly if run() did not get there.
  void shutdown();
  // The shutdown steps that have run, in order (for tests).
  const std::vector<std::string>& shutdown_steps() const;

 private:
  enum class StepEnd { kNext, kRolledBack, kStopped, kStoppedEarly };
  int train_to_end();
  void plan_shutdown();
  StepEnd step();
  struct StepControl;
  struct StepTimes {
    double data_wait_ms = 0, optimizer_ms = 0, step_ms = 0;
  };
  StepControl control_of(const StepTotals& totals);
  StepOutcome outcome_of(const zero::StepResult& result, const StepControl& control, const HostTotals& totals, double lr,
                         int64_t accumulation, const StepTimes& times);
  void roll_back();
  void save(int64_t steps_done);
  StepEnd end_step(const StepSignals& all);
  // Evaluates every set at step `done`; a candidate (not the at_start baseline) counts for the
  // best checkpoint and early stopping.
  EvalTracker::Verdict evaluate(int64_t done, bool candidate);
  bool eval_due(int64_t done) const;
  // eval.tasks at step `done`: scored over the data-parallel ranks, logged by rank 0.
  void score_tasks(int64_t done);
  // eval.samples at step `done`: every rank generates them, rank 0 writes them.
  void write_samples(int64_t done);
  bool evaluates() const;  // sets, tasks or samples
  struct Parts;
  std::unique_ptr<Parts> p_;
};

}  // namespace dstrain::train
