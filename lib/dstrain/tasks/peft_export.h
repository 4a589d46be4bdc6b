#pragma once
// A LoRA run's checkpoint in PEFT's format (`dstrain export-hf` of a run with lora.rank > 0):
// adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora, modules_to_save, the base it
// belongs to, target_modules as a regular expression that names exactly the adapted projections,
// so that PEFT attaches to those and no other; a routed expert's with any index or none, so that
// PEFT under transformers 5 fuses them into the experts' target_parameters) and
// adapter_model.safetensors with PEFT's keys: base_model.model.<module>.lora_A.weight [r, in],
// ...lora_B.weight [out, r], and base_model.model.<name> for the modules saved in full. B's rows
// are permuted like their projection's (V2/V3's interleaved RoPE rows). `PeftModel.from_pretrained`
// loads it on the base model (model.init_from). Or merged: each adapted weight W + scale B A
// (`--merge`), written as any export is.
#include <string>
#include <vector>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"

namespace at {
class Tensor;
}

namespace dstrain::tasks {

// Whether a checkpoint tensor is an adapter's (<module>.lora_A.weight, .lora_B.weight or DoRA's .lora_magnitude_vector).
bool is_adapter_tensor(const std::string& name);

// PEFT's target_modules for these adapter tensors: model\.layers\.(0|1|...)\.(self_attn\.q_proj|...).
std::string peft_target_regex(const std::vector<std::string>& adapter_tensors);

// Writes adapter_config.json and adapter_model.safetensors (`dtype`: F32, BF16 or F16) into
// out_dir; returns the files written. Throws Error{kUsage} when the run has no Hugging Face base
// (model.init_from), naming --merge.
std::vector<std::string> write_peft_adapter(const config::Recipe& recipe, const ckpt::Reader& reader, const std::string& dtype,
                                            const std::string& out_dir);

// Weight `name` (`weight`: float32, dstrain's layout, from the checkpoint or the base it names)
// with its adapter in the checkpoint merged in when it has one: W + scale · B A (DoRA: times
// m / |W + scale · B A| per row), computed in float64.
at::Tensor merged_weight(const config::Recipe& recipe, const ckpt::Reader& reader, const std::string& name, const at::Tensor& weight);
// A checkpoint's tensor as float32.
at::Tensor read_fp32(const ckpt::Reader& reader, const std::string& name);

}  // namespace dstrain::tasks
