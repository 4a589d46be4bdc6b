#pragma once
// Hugging Face layout in and out: config.json (model_type llama for dense models, deepseek_v2 or
// deepseek_v3 for mla_moe) plus model.safetensors, tensors under their HF names (dstrain's own
// names). V2/V3 checkpoints store the RoPE dims of q and k_pe as interleaved pairs; dstrain uses
// the half-split layout, so those rows are permuted on the way in and out.
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/model/named_tensor.h"

namespace dstrain::model {

// Writes out_dir/config.json and out_dir/model.safetensors (float32), atomically each.
void export_hf(const config::ModelConfig& config, const NamedTensors& params, const std::string& out_dir);

// Copies weights from an HF directory (model.safetensors, or shards listed in
// model.safetensors.index.json) into `params` (and `buffers`, when the files hold them), by
// name; F32, BF16 and F16 are converted. Throws Error{kCheckpoint} naming a missing tensor or a
// shape mismatch.
void load_hf_weights(const std::string& dir, const config::ModelConfig& config, const NamedTensors& params,
                     const NamedTensors& buffers = {});

// Writes params and buffers to HF layout (see above).
void export_hf(const config::ModelConfig& config, const NamedTensors& params, const NamedTensors& buffers, const std::string& out_dir);

}  // namespace dstrain::model
