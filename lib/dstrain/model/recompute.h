#pragma once
// Activation checkpointing (train.activation_checkpointing): a region of the forward pass runs
// without keeping its intermediate tensors for backward; backward runs the region again, with
// gradients, from its saved inputs, and backpropagates through that second run (the reentrant
// scheme of torch.utils.checkpoint and DeepSpeed). Parameters the region reads get their
// gradients as in a normal backward. The region must compute the same values both times: no
// randomness, and side effects (counters) only when `again` is false.
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "dstrain/config/enums.h"

namespace dstrain::model {

using Region = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs, bool again)>;

// Runs `region` on `inputs`; with grad mode on and an input that requires grad, only the inputs
// are kept for backward. Outputs may not be undefined.
std::vector<at::Tensor> recompute(const Region& region, const std::vector<at::Tensor>& inputs);

// The one-tensor form.
at::Tensor recompute(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);

}  // namespace dstrain::model
