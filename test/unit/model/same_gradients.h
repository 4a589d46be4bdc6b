#pragma once
// Every parameter's gradient of one model against another's (an objective against its formula on
// the whole logits with plain autograd), and an objective's metrics.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/objective.h"

namespace dstrain::test {

inline std::vector<at::Tensor> parameter_grads(const model::CausalLM& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::zeros_like(p.tensor));
  return out;
}

// Each gradient of `ours` equals `theirs` within 2e-5 of the latter's largest element.
inline void check_same_gradients(const model::CausalLM& ours, const model::CausalLM& theirs) {
  const std::vector<at::Tensor> got = parameter_grads(ours), expected = parameter_grads(theirs);
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(expected[i].abs().max().item<double>(), 1e-12);
    INFO(ours.parameters()[i].name);
    CHECK((got[i] - expected[i]).abs().max().item<double>() / scale <= 2e-5);
  }
}

// The objective's metric named `name` on `v`: its sum over its count.
inline double metric_value(const model::Objective& objective, const model::ObjectiveValue& v, const std::string& name) {
  const auto shapes = objective.metrics();
  for (size_t i = 0; i < shapes.size(); ++i)
    if (shapes[i].name == name)
      return v.terms[static_cast<int64_t>(i)][0].item<double>() / v.terms[static_cast<int64_t>(i)][1].item<double>();
  FAIL("no metric " << name);
  return 0;
}

}  // namespace dstrain::test
