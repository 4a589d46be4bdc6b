#include "dstrain/train/step_runner.h"

#include <ATen/ATen.h>

#include "dstrain/device/host_read.h"
#include "dstrain/model/objective.h"

namespace dstrain::train {

HostTotals read_totals(const std::vector<double>& values, int64_t trained_targets) {
  HostTotals out;
  out.trained_targets = trained_targets;
  if (values.size() < 2) return out;
  out.loss = values[0], out.token_loss = values[1];
  for (size_t i = 2; i + 1 < values.size(); i += 2) out.term_sums.push_back(values[i]), out.term_counts.push_back(values[i + 1]);
  return out;
}

HostTotals read_totals(const StepTotals& totals) { return read_totals(device::read_to_host(totals.values), totals.trained_targets); }

TotalsAccumulator::TotalsAccumulator(size_t terms, const c10::Device& device) {
  totals_.values = at::zeros({2 + 2 * static_cast<int64_t>(terms)}, at::TensorOptions().dtype(at::kDouble).device(device));
}

void TotalsAccumulator::add_loss(const at::Tensor& part) {
  totals_.values.narrow(0, 0, 1).add_(part.detach().to(at::kDouble).reshape({1}));
}

void TotalsAccumulator::add_value(const model::ObjectiveValue& value) {
  totals_.values.narrow(0, 1, 1).add_(value.main.to(at::kDouble).reshape({1}));
  totals_.trained_targets += value.count;
  if (value.terms.defined()) totals_.values.narrow(0, 2, value.terms.numel()).add_(value.terms.reshape({-1}));
}

StepTotals TotalsAccumulator::take() { return std::move(totals_); }

}  // namespace dstrain::train
