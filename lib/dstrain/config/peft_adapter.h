#pragma once
// lora.init_from: a PEFT LoRA adapter folder, checked against the recipe's lora block before
// anything runs (adapter_config.json alone; the model layer reads the weights).
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// What keeps the folder `lora.init_from` names from starting this run's adapters: missing files,
// another peft_type, per-module ranks, or an r, lora_alpha, use_rslora or use_dora other than the recipe's (one
// message each, naming the key and `source`, where the value came from).
std::vector<std::string> peft_adapter_problems(const LoraConfig& lora, const std::string& source);

}  // namespace dstrain::config
