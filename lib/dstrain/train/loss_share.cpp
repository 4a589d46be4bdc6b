#include "dstrain/train/loss_share.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dstrain/comm/communicator.h"
#include "dstrain/model/objective.h"

namespace dstrain::train {

at::Tensor LossShare::reported(const at::Tensor& final_loss) const {
  return terms_share.defined() ? final_loss.detach() - terms_share : final_loss.detach();
}

at::Tensor aux_share(const at::Tensor& aux, const data::Batch& host_batch, config::LossNormalization mode, double global) {
  // The auxiliary losses are means over the micro-batch: weighted by its share of the units.
  return aux.defined() ? aux * (static_cast<double>(loss_units(host_batch, mode)) / global) : at::Tensor();
}

LossShare loss_share(const model::ObjectiveValue& value, const data::Batch& host_batch, config::LossNormalization mode, double global,
                     bool with_aux) {
  const double divisor =
      mode == config::LossNormalization::kMicroBatchMean ? static_cast<double>(std::max<int64_t>(value.count, 1)) * global : global;
  LossShare share{value.sum / divisor, value.terms.defined() ? (value.sum.detach() - value.main) / divisor : at::Tensor()};
  if (with_aux && value.aux.defined()) share.loss = share.loss + aux_share(value.aux, host_batch, mode, global);
  return share;
}

int64_t loss_units(const data::Batch& batch, config::LossNormalization mode) {
  if (batch.pairs > 0) return mode == config::LossNormalization::kMicroBatchMean ? 1 : batch.pairs;  // preference pairs: a mean over pairs
  switch (mode) {
    case config::LossNormalization::kMicroBatchMean:
      return batch.trained_targets > 0 ? 1 : 0;
    case config::LossNormalization::kPerSample:
      return batch.samples;
    case config::LossNormalization::kGlobalTokens:
      break;
  }
  return batch.trained_targets;
}

int64_t global_loss_units(comm::Communicator& comm, const std::vector<data::Batch>& batches, config::LossNormalization mode) {
  int64_t mine = 0;
  for (const data::Batch& b : batches) mine += loss_units(b, mode);
  return comm::sum_exactly(comm, mine);
}

}  // namespace dstrain::train
