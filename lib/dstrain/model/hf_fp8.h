#pragma once
// DeepSeek's block-scaled FP8 weights, the format V3, R1 and V3.1 are released in: each Linear
// weight of attention and the MLPs stored as float8_e4m3fn with a float32 `<name>_scale_inv`
// per block of 128 × 128 (the grid ceil-sized: a partial block at an edge has its own scale),
// described by config.json's quantization_config. Reading dequantizes exactly as DeepSeek's
// weight_dequant; writing quantizes each block by its absolute maximum.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dstrain::model {

struct Fp8Format {
  std::string fmt = "e4m3";  // the weights' float8: e4m3 (float8_e4m3fn, max 448) or e5m2 (max 57344)
  int64_t block_rows = 128, block_cols = 128;
  bool ue8m0 = false;                         // scale_fmt ue8m0: every scale a power of two
  std::string activation_scheme = "dynamic";  // inference's; training quantizes no activations
};

// config.json's quantization_config of a Hugging Face folder (nullopt: none, or no config.json).
// Throws Error{kCheckpoint} naming the file and key for a method, format or block size dstrain
// cannot read.
std::optional<Fp8Format> read_fp8_format(const std::string& dir);
// The JSON text of `format` as DeepSeek writes it in config.json.
std::string fp8_format_json(const Fp8Format& format);

// The safetensors name of a weight's scales: "<name>_scale_inv".
std::string scale_name_of(const std::string& weight_name);
// The scale grid of a 2-D [rows, cols] weight: [ceil(rows / block_rows), ceil(cols / block_cols)].
std::vector<int64_t> scale_grid(const std::vector<int64_t>& shape, const Fp8Format& format);

// W[i, j] = float(W8[i, j]) · scale_inv[i / block_rows, j / block_cols], in float32: DeepSeek's
// weight_dequant. `weight` is a float8 tensor, `scale_inv` float32 (bfloat16 and e8m0 scales
// are widened first). Shapes are the caller's to check (scale_grid).
at::Tensor dequantize_fp8(const at::Tensor& weight, const at::Tensor& scale_inv, const Fp8Format& format);

struct Fp8Weight {
  at::Tensor weight;     // float8_e4m3fn
  at::Tensor scale_inv;  // float32, scale_grid(weight)
};
// Per block: s = amax / 448 (ue8m0: the next power of two at or above it; a block of zeros: 1),
// stored w / s rounded to the nearest float8. The error of a stored value is at most half a
// float8 step: 2^-4 of it, or 2^-10 · s below the smallest normal.
Fp8Weight quantize_fp8(const at::Tensor& weight, const Fp8Format& format);

// Which tensors DeepSeek's release stores in FP8 follows from their role (model/param_role.h:
// stored_as_fp8); an export asks the model's declared shapes (model_tensor_shapes).

}  // namespace dstrain::model
