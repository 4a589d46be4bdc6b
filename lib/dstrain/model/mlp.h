#pragma once
// A SwiGLU MLP as a part: its three projections (dense layers, MLA's dense layers, the shared
// experts), declared through the builder and run through their Linears.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "dstrain/model/linear.h"

namespace dstrain::model {

class ParamBuilder;

struct Mlp {
  const Linear *gate = nullptr, *up = nullptr, *down = nullptr;  // null in a group this model does not hold
};

// prefix + {gate,up,down}_proj, [width, hidden] / [hidden, width]; gate and up drawn N(0, std),
// down N(0, residual_std), in that order.
Mlp add_mlp(ParamBuilder& builder, const std::string& prefix, ParamRole role, int64_t width, int64_t hidden, double std,
            double residual_std);

// down(silu(gate(x)) * up(x)); recompute_activation as model/layers.h's swiglu.
at::Tensor swiglu(const at::Tensor& x, const Mlp& mlp, bool recompute_activation);

}  // namespace dstrain::model
