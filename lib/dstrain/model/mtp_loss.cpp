#include "dstrain/model/mtp_loss.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dstrain/core/error.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"

namespace dstrain::model {

at::Tensor mtp_labels(const data::Batch& batch, int64_t k) {
  if (batch.ahead_labels.defined()) {  // a sequence-parallel share: every position, the targets past it from ahead_labels
    const int64_t T = batch.length();
    const at::Tensor labels = at::cat({batch.labels, batch.ahead_labels}, 1).narrow(1, k, T);
    if (!batch.document_ids.defined()) return labels;
    // The whole rows' documents, -1 past their end (no document: the target is not trained).
    const at::Tensor past = at::full({batch.rows(), batch.ahead_labels.size(1)}, -1, batch.document_ids.options());
    const at::Tensor documents = at::cat({batch.document_ids, past}, 1);
    const at::Tensor crosses = documents.narrow(1, batch.sequence_begin + k, T).ne(documents.narrow(1, batch.sequence_begin, T));
    return labels.masked_fill(crosses, kIgnoreIndex);
  }
  const int64_t n = batch.length() - k;
  at::Tensor labels = batch.labels.narrow(1, k, n);
  if (!batch.document_ids.defined()) return labels;
  const at::Tensor crosses = batch.document_ids.narrow(1, k, n).ne(batch.document_ids.narrow(1, 0, n));
  return labels.masked_fill(crosses, kIgnoreIndex);
}

at::Tensor mtp_target_weights(const data::Batch& batch, int64_t k) {
  if (!batch.target_weights.defined()) return at::Tensor();
  if (batch.ahead_labels.defined()) return at::cat({batch.target_weights, batch.ahead_weights}, 1).narrow(1, k, batch.length());
  return batch.target_weights.narrow(1, k, batch.length() - k);
}

std::string mtp_term_name(int64_t k) { return fmt::format("mtp_{}", k); }

void add_mtp_terms(Objective& loss, const config::ModelConfig& c, int64_t tokens) {
  const int64_t chunk = loss.chunk_tokens();
  for (int64_t k = 1; k <= c.mtp_depth; ++k)
    loss.add_term(mtp_term_name(k), "mtp_loss", c.mtp_weight_at(tokens) / static_cast<double>(c.mtp_depth),
                  [k, chunk](const CausalLM&, const CausalLM::Hidden& h, const data::Batch& batch) {
                    if (static_cast<int64_t>(h.mtp.size()) < k)
                      throw Error(ErrorCode::kInternal, fmt::format("a forward without MTP depth {}'s hidden states", k),
                                  "report this as a bug");
                    const at::Tensor labels = mtp_labels(batch, k), weights = mtp_target_weights(batch, k);
                    // per_sample: the weights' sum, so that sum / count is a mean of sample means, as the loss reports.
                    const at::Tensor trained = labels.ne(kIgnoreIndex);
                    return TermValue{head_cross_entropy(h.mtp[static_cast<size_t>(k - 1)], h.head, labels, weights, chunk),
                                     weights.defined() ? (weights * trained).sum() : trained.sum()};
                  });
}

void set_mtp_weights(Objective& loss, const config::ModelConfig& c, int64_t tokens) {
  for (int64_t k = 1; k <= c.mtp_depth; ++k) loss.set_weight(mtp_term_name(k), c.mtp_weight_at(tokens) / static_cast<double>(c.mtp_depth));
}

}  // namespace dstrain::model
