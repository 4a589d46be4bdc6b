#pragma once
// The attention seam: every family's attention core ends in attend(), and what decides which
// token sees which (positions, documents, causality) is one AttentionScope built once per
// forward. A sequence-parallel or ring backend implements attend() with this signature.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

struct AttentionScope {
  at::Tensor positions;     // int64 [B, T] for RoPE; undefined: 0..T-1 in every row
  at::Tensor document_ids;  // int64 [B, T], each token's document (packed data); undefined: one per row
  at::Tensor mask;          // bool [B, 1, T, T], true = may attend; undefined: causal over the row
  // Sequence parallelism (model/sequence_parallel.h): this rank holds tokens [r T/S, (r + 1) T/S)
  // of every row, and attend() exchanges heads for tokens around the attention; positions are this
  // rank's tokens' (RoPE runs before the exchange), document_ids and mask the whole rows'.
  comm::Communicator* sequence = nullptr;

  // The scope of a forward: the document mask is built here, once, from document_ids (or an
  // explicit mask is taken as it is).
  static AttentionScope of(const at::Tensor& positions, const at::Tensor& document_ids, const at::Tensor& explicit_mask,
                           comm::Communicator* sequence = nullptr);
  // The first n tokens (multi-token prediction's shorter sequences).
  AttentionScope first(int64_t n) const;
};

// Softmax attention over heads: q [B, h, T, dk], k [B, h, T, dk], v [B, h, T, dv] -> [B, h, T, dv],
// causal within the scope. scale: the softmax scale (none: dk^-0.5). With the scope's sequence
// group, T is this rank's share of the tokens, and the attention runs on h / S heads of all of them.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionScope& scope,
                  std::optional<double> scale = std::nullopt);

// Causal attention that stays within documents: token t sees token s <= t only when no
// `eos` token lies in [s, t) (the end-of-document token belongs to the document it ends).
// Returns bool [B, 1, T, T] for int64 inputs [B, T].
at::Tensor document_causal_mask(const at::Tensor& inputs, int64_t eos);
// The same from each token's document index int64 [B, T] (data::Batch::document_ids).
at::Tensor document_causal_mask_of(const at::Tensor& document_ids);

}  // namespace dstrain::model
