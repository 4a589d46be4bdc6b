#pragma once
// Hugging Face layout in and out for the dense model: config.json (model_type llama) plus
// model.safetensors, tensors under their HF names (which are dstrain's own names).
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/model/named_tensor.h"

namespace dstrain::model {

// Writes out_dir/config.json and out_dir/model.safetensors (float32), atomically each.
void export_hf(const config::ModelConfig& config, const NamedTensors& params, const std::string& out_dir);

// Copies weights from an HF directory (model.safetensors, or shards listed in
// model.safetensors.index.json) into `params`, by name; F32, BF16 and F16 are converted to the
// parameters' dtype. Throws Error{kCheckpoint} naming a missing tensor or a shape mismatch.
void load_hf_weights(const std::string& dir, const NamedTensors& params);

}  // namespace dstrain::model
