#pragma once
// The key/value cache of generation: each decoder layer's keys and values of the tokens seen so
// far, so that a new token costs a forward over itself against the cache (O(context)), not a
// forward over the whole context again (O(context²)). What a layer keeps is its family's choice:
//   dense (GQA)  keys after RoPE and values, [B, kv heads, S, head_dim] each (before GQA's repeat)
//   MLA          one tensor per token, the normed latent and the roped key: [B, S, kv_lora_rank +
//                qk_rope_head_dim] (DeepSeek-V2/V3's inference cache), values unused
// Rows may start at different places (left padding): `valid` marks the positions that hold a
// token; a padding position attends to itself only and no token attends to it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dstrain/model/attention.h"

namespace dstrain::model {

class KvCache {
 public:
  // `layers` decoder layers, room for `capacity` positions of `rows` rows.
  KvCache(int64_t layers, int64_t rows, int64_t capacity);
  int64_t rows() const { return rows_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // positions filled by the forwards so far

  // The next forward's T tokens: `valid` bool [B, T] (which hold a token), their RoPE positions
  // [B, T]. Returns the scope that forward attends with: the positions, and the mask [B, 1, T,
  // length + T] over the cache and the new tokens (causal, padding excluded).
  AttentionScope begin(const at::Tensor& valid, const at::Tensor& positions);
  // Called by a layer in that forward: stores its new keys (and values; undefined for MLA) at
  // [length, length + T) along `dim` and returns everything cached so far with them, [.., length
  // + T, ..]. The first call of a layer allocates its buffers (zeros, the new tensors' type).
  at::Tensor store_keys(int64_t layer, const at::Tensor& keys, int64_t dim);
  at::Tensor store_values(int64_t layer, const at::Tensor& values, int64_t dim);
  // After the forward: the new tokens are part of the cache.
  void commit();
  // Rows in a forward, and tokens it adds (begin()'s T).
  int64_t pending() const { return pending_; }

 private:
  at::Tensor store(std::vector<at::Tensor>& buffers, int64_t layer, const at::Tensor& t, int64_t dim);
  int64_t rows_, capacity_, length_ = 0, pending_ = 0;
  std::vector<at::Tensor> keys_, values_;
  at::Tensor valid_;  // bool [B, capacity]
};

}  // namespace dstrain::model
