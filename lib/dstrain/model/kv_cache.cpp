#include "dstrain/model/kv_cache.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dstrain/core/error.h"

namespace dstrain::model {

KvCache::KvCache(int64_t layers, int64_t rows, int64_t capacity)
    : rows_(rows), capacity_(capacity), keys_(static_cast<size_t>(layers)), values_(static_cast<size_t>(layers)) {}

AttentionScope KvCache::begin(const at::Tensor& valid, const at::Tensor& positions) {
  const int64_t T = valid.size(1);
  if (length_ + T > capacity_)
    throw Error(ErrorCode::kInternal,
                fmt::format("the key/value cache holds {} positions, and {} + {} were asked for", capacity_, length_, T),
                "report this as a bug");
  if (!valid_.defined()) valid_ = at::zeros({rows_, capacity_}, valid.options().dtype(at::kBool));
  valid_.narrow(1, length_, T).copy_(valid);
  pending_ = T;
  const int64_t S = length_ + T;
  // Query t (absolute position length + t) sees s <= length + t where s holds a token, and itself:
  // a padding query attends to itself alone (a row of -inf everywhere would be NaN, and its NaN
  // values would reach the other tokens through the masked product's 0 * NaN).
  const at::Tensor query_at = at::arange(length_, S, valid.options().dtype(at::kLong)).view({T, 1});
  const at::Tensor key_at = at::arange(0, S, valid.options().dtype(at::kLong)).view({1, S});
  const at::Tensor causal = key_at.le(query_at);
  const at::Tensor self = key_at.eq(query_at);
  const at::Tensor sees = causal.unsqueeze(0).logical_and(valid_.narrow(1, 0, S).unsqueeze(1)).logical_or(self.unsqueeze(0));
  return AttentionScope{positions, {}, sees.unsqueeze(1)};
}

at::Tensor KvCache::store(std::vector<at::Tensor>& buffers, int64_t layer, const at::Tensor& t, int64_t dim) {
  at::Tensor& buffer = buffers.at(static_cast<size_t>(layer));
  if (!buffer.defined()) {
    std::vector<int64_t> shape = t.sizes().vec();
    shape[static_cast<size_t>(dim)] = capacity_;
    buffer = at::zeros(shape, t.options());
  }
  buffer.narrow(dim, length_, pending_).copy_(t);
  return buffer.narrow(dim, 0, length_ + pending_);
}

at::Tensor KvCache::store_keys(int64_t layer, const at::Tensor& keys, int64_t dim) { return store(keys_, layer, keys, dim); }
at::Tensor KvCache::store_values(int64_t layer, const at::Tensor& values, int64_t dim) { return store(values_, layer, values, dim); }

void KvCache::commit() {
  length_ += pending_;
  pending_ = 0;
}

}  // namespace dstrain::model
