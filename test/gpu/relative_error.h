#pragma once
// The GPU tests' yardstick: the largest absolute difference relative to the reference's largest
// magnitude, computed in double.
#include <ATen/ATen.h>

namespace dstrain::test {

inline double rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max()).item<double>();
}

}  // namespace dstrain::test
