#pragma once
// A tensor with its stable (Hugging Face) name. Headers see only ATen/core/Tensor.h.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::model {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

using NamedTensors = std::vector<NamedTensor>;

// A tensor's name and shape alone (a model's, without its values).
struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
  bool required = true;   // false: a buffer that some checkpoints lack (V2 has no e_score_correction_bias)
  int64_t mtp_depth = 0;  // a multi-token prediction module's (k >= 1): a checkpoint holds all of that module or none
};

}  // namespace dstrain::model
