#pragma once
// A tensor with its stable (Hugging Face) name. Headers see only ATen/core/Tensor.h.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/model/param_role.h"

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
  bool required = true;               // false: a buffer that some checkpoints lack (V2 has no e_score_correction_bias)
  int64_t mtp_depth = 0;              // a multi-token prediction module's (k >= 1): a checkpoint holds all of that module or none
  ParamRole role = ParamRole::kBias;  // a parameter's role; buffers (V3's selection bias) are biases
  bool buffer = false;                // saved state, not a parameter
};

}  // namespace dstrain::model
