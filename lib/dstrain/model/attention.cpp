#include "dstrain/model/attention.h"

#include <ATen/ATen.h>

#include "dstrain/comm/communicator.h"
#include "dstrain/model/sequence_parallel.h"

namespace dstrain::model {

AttentionScope AttentionScope::of(const at::Tensor& positions, const at::Tensor& document_ids, const at::Tensor& explicit_mask,
                                  comm::Communicator* sequence) {
  AttentionScope s{positions, document_ids, explicit_mask, sequence};
  if (document_ids.defined() && !explicit_mask.defined()) s.mask = document_causal_mask_of(document_ids);
  return s;
}

AttentionScope AttentionScope::first(int64_t n) const {
  AttentionScope s;
  if (positions.defined()) s.positions = positions.narrow(1, 0, n);
  if (document_ids.defined()) s.document_ids = document_ids.narrow(1, 0, n);
  if (mask.defined()) s.mask = mask.narrow(2, 0, n).narrow(3, 0, n);
  return s;
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionScope& scope, std::optional<double> scale) {
  if (scope.sequence && scope.sequence->world_size() > 1) {
    comm::Communicator& group = *scope.sequence;
    AttentionScope whole = scope;
    whole.sequence = nullptr;
    return sequence_to_heads(attend(heads_to_sequence(q, group), heads_to_sequence(k, group), heads_to_sequence(v, group), whole, scale),
                             group);
  }
  if (scope.mask.defined()) return at::scaled_dot_product_attention(q, k, v, scope.mask, 0.0, /*is_causal=*/false, scale);
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale);
}

at::Tensor document_causal_mask(const at::Tensor& inputs, int64_t eos) {
  const at::Tensor is_eos = inputs.eq(eos).to(at::kLong);
  const at::Tensor doc = is_eos.cumsum(1) - is_eos;  // EOS closes its own document
  const int64_t T = inputs.size(1);
  const at::Tensor causal = at::ones({T, T}, inputs.options().dtype(at::kBool)).tril();
  return (doc.unsqueeze(2) == doc.unsqueeze(1)).logical_and(causal).unsqueeze(1);
}

at::Tensor document_causal_mask_of(const at::Tensor& document_ids) {
  const int64_t T = document_ids.size(1);
  const at::Tensor causal = at::ones({T, T}, document_ids.options().dtype(at::kBool)).tril();
  return (document_ids.unsqueeze(2) == document_ids.unsqueeze(1)).logical_and(causal).unsqueeze(1);
}

}  // namespace dstrain::model
