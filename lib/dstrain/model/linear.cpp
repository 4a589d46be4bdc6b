#include "dstrain/model/linear.h"

#include <ATen/ATen.h>

namespace dstrain::model {
namespace {
thread_local TrainingRows training_rows;
thread_local bool adapters_enabled = true;
}  // namespace

bool adapters_on() { return adapters_enabled; }

AdaptersOff::AdaptersOff() : previous_(adapters_enabled) { adapters_enabled = false; }

AdaptersOff::~AdaptersOff() { adapters_enabled = previous_; }

const TrainingRows& current_training_rows() { return training_rows; }

TrainingRowsScope::TrainingRowsScope(TrainingRows rows) : previous_(training_rows) { training_rows = rows; }

TrainingRowsScope::~TrainingRowsScope() { training_rows = previous_; }

at::Tensor apply(const Linear& linear, const at::Tensor& x, std::optional<c10::ScalarType> compute) {
  const at::Tensor in = compute ? x.to(*compute) : x;
  const at::Tensor weight = compute ? linear.weight.to(*compute) : linear.weight;
  at::Tensor out = linear.base ? linear.base->product(in, weight) : at::linear(in, weight);
  if (adapters_enabled)
    for (const auto& adapter : linear.adapters) out = adapter->apply(in, out);
  return out;
}

}  // namespace dstrain::model
