#pragma once
// A tensor with its stable (Hugging Face) name. Headers see only ATen/core/Tensor.h.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dstrain::model {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

using NamedTensors = std::vector<NamedTensor>;

}  // namespace dstrain::model
