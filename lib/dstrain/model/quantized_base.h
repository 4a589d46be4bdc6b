#pragma once
// lora.base nf4 | fp8: a LoRA run's frozen projections kept quantized (QLoRA's 4-bit NF4, or
// DeepSeek's 128x128-block FP8) instead of in the model's dtype. Each becomes its Linear's base
// (or its routed expert's, LocalExperts::*_base): the product dequantizes the weight into the
// input's dtype, and backward dequantizes it again instead of keeping it (as bitsandbytes'
// MatMul4Bit), so the dequantized copies live one projection at a time. The weights leave the
// model's parameters: ZeRO never sees them (every data-parallel rank holds the quantized base
// whole), checkpoints never held them (a LoRA checkpoint names its base), and the Linear keeps
// their shape only.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "dstrain/config/recipe.h"

namespace dstrain::model {

class CausalLM;

struct QuantizedBase {
  config::LoraBase format = config::LoraBase::kModel;
  int64_t projections = 0;       // weights quantized (a routed expert's three count three)
  int64_t elements = 0;          // their elements
  int64_t bytes = 0;             // what their storage takes
  int64_t model_bytes = 0;       // what they took in the model's dtype
  int64_t kept_as_released = 0;  // fp8: weights whose FP8 bytes and scales came from the folder as they are
};

// After model.init_from's weights are loaded and the adapters attached, before the engine takes
// the parameters: every frozen projection that DeepSeek's release stores in FP8 (model::stored_as_fp8:
// attention, dense MLPs, shared and routed experts) is quantized on the CPU, its storage moved to
// `device`, and its parameter removed from the model. fp8 keeps the folder's own FP8 weights when it
// has them (its quantization_config's block size), and quantizes any other by amax / 448.
QuantizedBase quantize_base(CausalLM& model, const config::Recipe& recipe, const c10::Device& device);
// "lora: base in NF4: 96 projections, 3.1 MiB on this rank (12.0 MiB in fp32)".
std::string describe_quantized_base(const QuantizedBase& q, const std::string& dtype);

}  // namespace dstrain::model
