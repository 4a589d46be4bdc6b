#include "dstrain/model/sequence_parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Chunk i of dim 0 of `send` to rank i; chunk i of the result from rank i.
at::Tensor exchange_chunks(comm::Communicator& group, const at::Tensor& send) {
  at::Tensor received = at::empty_like(send);
  const std::vector<int64_t> ones(static_cast<size_t>(group.world_size()), 1);
  group.all_to_all(send, received, ones, ones)->wait();
  return received;
}

at::Tensor to_sequence(const at::Tensor& x, comm::Communicator& group) {
  const int64_t S = group.world_size(), B = x.size(0), H = x.size(1), t = x.size(2), d = x.size(3);
  if (H % S != 0)
    throw Error(ErrorCode::kInternal, fmt::format("sequence parallelism over {} ranks of an attention with {} heads", S, H),
                "report this as a bug (the config's check lets only sizes that divide the heads through)");
  const at::Tensor send = x.reshape({B, S, H / S, t, d}).permute({1, 0, 2, 3, 4}).contiguous();  // [to rank, B, H/S, t, d]
  return exchange_chunks(group, send).permute({1, 2, 0, 3, 4}).reshape({B, H / S, S * t, d});    // from rank r: tokens r t..
}

at::Tensor to_heads(const at::Tensor& x, comm::Communicator& group) {
  const int64_t S = group.world_size(), B = x.size(0), h = x.size(1), T = x.size(2), d = x.size(3);
  const at::Tensor send = x.reshape({B, h, S, T / S, d}).permute({2, 0, 1, 3, 4}).contiguous();  // [to rank, B, h, T/S, d]
  return exchange_chunks(group, send).permute({1, 0, 2, 3, 4}).reshape({B, S * h, T / S, d});    // from rank r: heads r h..
}

comm::Communicator* group_of(AutogradContext* ctx) { return reinterpret_cast<comm::Communicator*>(ctx->saved_data["group"].toInt()); }

struct HeadsToSequence : torch::autograd::Function<HeadsToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return to_sequence(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {to_heads(grads[0], *group_of(ctx)), at::Tensor()}; }
};

struct SequenceToHeads : torch::autograd::Function<SequenceToHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Communicator* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return to_heads(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {to_sequence(grads[0], *group_of(ctx)), at::Tensor()}; }
};

}  // namespace

at::Tensor heads_to_sequence(const at::Tensor& x, comm::Communicator& group) { return HeadsToSequence::apply(x, &group); }

at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& group) { return SequenceToHeads::apply(x, &group); }

}  // namespace dstrain::model
