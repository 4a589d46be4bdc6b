#pragma once
// Ulysses sequence parallelism's exchanges (DeepSpeed-Ulysses): the S ranks of a sequence group
// each hold T / S consecutive tokens of every row; around attention one all-to-all gives each rank
// all T tokens of H / S heads, and another gives the tokens back. Differentiable: the gradient of
// each is the other.
#include <ATen/core/Tensor.h>

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

// [B, H, T/S, d] on each rank -> [B, H/S, T, d]: rank r gets heads [r H/S, (r + 1) H/S) of every
// rank's tokens, in rank order. H must be divisible by S.
at::Tensor heads_to_sequence(const at::Tensor& x, comm::Communicator& group);
// The inverse: [B, H/S, T, d] -> [B, H, T/S, d].
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& group);

}  // namespace dstrain::model
