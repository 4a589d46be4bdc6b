#include "dstrain/model/mlp.h"

#include <ATen/ATen.h>

#include "dstrain/model/layers.h"
#include "dstrain/model/param_builder.h"

namespace dstrain::model {

Mlp add_mlp(ParamBuilder& b, const std::string& prefix, ParamRole role, int64_t width, int64_t hidden, double std, double residual_std) {
  Mlp mlp;
  mlp.gate = b.add_linear(prefix + "gate_proj", role, b.normal({width, hidden}, std));
  mlp.up = b.add_linear(prefix + "up_proj", role, b.normal({width, hidden}, std));
  mlp.down = b.add_linear(prefix + "down_proj", role, b.normal({hidden, width}, residual_std));
  return mlp;
}

at::Tensor swiglu(const at::Tensor& x, const Mlp& mlp, bool recompute_activation) {
  const Mlp m = mlp;  // the projections by value: a recomputed activation runs in backward
  return swiglu(
      x, [m](const at::Tensor& t) { return apply(*m.gate, t); }, [m](const at::Tensor& t) { return apply(*m.up, t); },
      [m](const at::Tensor& t) { return apply(*m.down, t); }, recompute_activation);
}

}  // namespace dstrain::model
