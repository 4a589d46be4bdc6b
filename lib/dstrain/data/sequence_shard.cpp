#include "dstrain/data/sequence_shard.h"

#include <ATen/ATen.h>

namespace dstrain::data {
namespace {

// `t` [B, T] extended to [B, T + pad] with `fill`, or with the last column + 1, + 2, ... (positions).
at::Tensor pad_columns(const at::Tensor& t, int64_t pad, double fill, bool count_on) {
  if (pad == 0 || !t.defined()) return t;
  const at::Tensor tail = count_on ? t.narrow(1, t.size(1) - 1, 1) + at::arange(1, pad + 1, t.options()).unsqueeze(0)
                                   : at::full({t.size(0), pad}, fill, t.options());
  return at::cat({t, tail}, 1);
}

}  // namespace

Batch sequence_shard(const Batch& batch, SequenceShare share) {
  if (share.size <= 1) return batch;
  Batch b = batch;
  const int64_t T = batch.length(), S = share.size, pad = (S - T % S) % S, width = (T + pad) / S;
  const at::Tensor positions = batch.sequential_positions || !batch.positions.defined()
                                   ? at::arange(T, batch.tokens.options()).expand({batch.rows(), T})
                                   : batch.positions;
  const at::Tensor& documents = batch.document_ids;
  const auto columns = [&](const at::Tensor& t) { return t.defined() ? t.narrow(1, share.rank * width, width).contiguous() : t; };
  b.tokens = columns(pad_columns(batch.tokens, pad, 0, false));
  b.labels = columns(pad_columns(batch.labels, pad, static_cast<double>(kIgnoreIndex), false));
  b.positions = columns(pad_columns(positions.contiguous(), pad, 0, true));
  b.target_weights = columns(pad_columns(batch.target_weights, pad, 0, false));
  if (pad > 0 && documents.defined())
    b.document_ids = pad_columns(documents, pad, static_cast<double>(documents.max().item<int64_t>() + 1), false);
  b.sequential_positions = false;
  b.whole_trained_targets = batch.trained_targets, b.whole_samples = batch.samples;
  b.sequence_begin = share.rank * width;
  if (share.lookahead > 0) {  // the columns after the share, padded past the row's end
    const int64_t D = share.lookahead, begin = (share.rank + 1) * width;
    const auto ahead = [&](const at::Tensor& t, double fill) {
      return pad_columns(t, pad + D, fill, false).narrow(1, begin, D).contiguous();
    };
    b.ahead_tokens = ahead(batch.tokens, 0);
    b.ahead_labels = ahead(batch.labels, static_cast<double>(kIgnoreIndex));
    if (batch.target_weights.defined()) b.ahead_weights = ahead(batch.target_weights, 0);
  }
  b.trained_targets = b.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  if (share.rank != 0) b.samples = 0;
  return b;
}

}  // namespace dstrain::data
