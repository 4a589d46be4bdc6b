#pragma once
// QLoRA's 4-bit NormalFloat storage of a frozen weight, as bitsandbytes makes it
// (quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True) on the CPU): each block
// of 64 consecutive elements (row-major) is divided by its absolute maximum and rounded to the
// nearest of NF4's 16 values, two codes per byte (the first in the high nibble); the block maxima
// are themselves stored in 8 bits ("double quantization"): their mean subtracted, then blocks of
// 256 quantized to bitsandbytes' signed dynamic map with an fp32 scale each. About 0.52 bytes per
// element. Dequantizing gives bitsandbytes' values bit for bit (tested against it).
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace dstrain::model {

struct Nf4Weight {
  std::vector<int64_t> shape;
  at::Tensor codes;          // uint8 [ceil(numel / 2)]: two 4-bit codes per byte, high nibble first
  at::Tensor absmax_codes;   // uint8 [blocks]: each 64-block's maximum, in the dynamic map
  at::Tensor absmax_scales;  // float32 [ceil(blocks / 256)]: the maxima's own block scales
  float absmax_offset = 0;   // the mean of the maxima, subtracted before quantizing them
  int64_t numel() const;
  int64_t bytes() const;  // what the storage takes
};

inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4AbsmaxBlockSize = 256;

// `weight` (any float dtype; quantized from its float32 values) on the CPU.
Nf4Weight quantize_nf4(const at::Tensor& weight);
// The weight in `dtype` (float32 values rounded once), on the codes' device.
at::Tensor dequantize_nf4(const Nf4Weight& q, c10::ScalarType dtype);
// The same storage on another device.
Nf4Weight nf4_to(const Nf4Weight& q, const c10::Device& device);

// NF4's 16 values, and bitsandbytes' signed 8-bit dynamic map (256 values, sorted), float32.
const at::Tensor& nf4_values();
const at::Tensor& dynamic_map();

}  // namespace dstrain::model
