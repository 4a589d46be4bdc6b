#pragma once
// The sequential runner (StepRunner without a pipeline): for each micro-batch, in order,
//   engine.begin_micro -> forward (model::Objective) -> its share of the step's loss
//   (loss_share.h) -> x the engine's loss scale -> backward -> engine.end_micro
// Its sums stay on the device (TotalsAccumulator): nothing is read to the host per micro-batch
// unless time_phases asks to wait for the device.
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/train/step_runner.h"

namespace dstrain::model {
class CausalLM;
class Objective;
}  // namespace dstrain::model
namespace dstrain::zero {
class Engine;
}

namespace dstrain::train {

class SequentialRunner final : public StepRunner {
 public:
  // engine: may be null for a runner that only evaluates, or whose test steps itself. Everything is borrowed.
  SequentialRunner(const model::CausalLM& model, const model::Objective& objective, zero::Engine* engine, const c10::Device& device);
  ~SequentialRunner() override;
  void add_observer(MicroBatchObserver* observer) override { observers_.push_back(observer); }
  // time_phases: wait for the device after the forward and the backward (wall_clock_breakdown).
  void set_time_phases(bool on) { time_phases_ = on; }
  // train.loss_normalization (global_tokens until set). per_sample needs batches weighed by
  // data::weigh_per_sample.
  void set_normalization(config::LossNormalization mode) { normalization_ = mode; }
  StepTotals train(const std::vector<data::Batch>& batches, int64_t global_units) override;
  StepTotals forward(const std::vector<data::Batch>& batches) override;
  StepTotals forward_with(const model::Objective& objective, const std::vector<data::Batch>& batches) override;
  int64_t forward_batches() const override { return 1; }

 private:
  void micro(const data::Batch& batch, size_t index, bool last, double global_units, TotalsAccumulator& sums);
  const model::CausalLM& model_;
  const model::Objective& objective_;
  std::unique_ptr<model::Objective> cross_entropy_;  // forward()'s
  zero::Engine* engine_;
  c10::Device device_;
  bool time_phases_ = false;
  config::LossNormalization normalization_ = config::LossNormalization::kGlobalTokens;
  std::vector<MicroBatchObserver*> observers_;
};

}  // namespace dstrain::train
