#pragma once
// Low-rank adapters on a model's projections (LoRA, Hu et al. 2021; rsLoRA, Kalajdzievski 2023),
// computed as PEFT computes them: y = base(x) + (x Aᵀ) Bᵀ · scale, scale = alpha / r (alpha / √r
// with rsLoRA); A [r, in] Kaiming-uniform (a = √5, PEFT's init: U(-1/√in, 1/√in)), B [out, r]
// zeros, so a fresh adapter leaves the model's output bitwise unchanged. Each A and B is a
// parameter of role `adapter` in its projection's layer group (ZeRO-3 gathers it with the layer;
// a pipeline stage holds its own), under PEFT's key names: <module>.lora_A.weight and
// <module>.lora_B.weight. Every other parameter is frozen: the engine keeps gradients and
// optimizer states for the adapters only. This is the model's half of issue 59 (the recipe's
// `lora:` block, dropout, DoRA, the routed experts, quantized bases and PEFT export follow).
#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

struct LoraSpec {
  int64_t rank = 8;
  double alpha = 8;
  bool rslora = false;
  // Module names' last part as PEFT writes them (q_proj, q_a_proj, kv_a_proj_with_mqa, o_proj,
  // gate_proj, ...), or "all-linear": every projection but the head and the MoE router. Never the
  // MTP modules' (transformers does not load them, so PEFT never adapts them).
  std::vector<std::string> targets = {"all-linear"};
};

double lora_scale(const LoraSpec& spec);
// Whether a projection of `model` gets an adapter: its module's last part is a target
// (all-linear: any but the router's), and it is neither a routed expert's nor in the final group
// (the MTP modules beside the head).
bool lora_targets(const LoraSpec& spec, const CausalLM& model, const Linear& linear);
// Attaches an adapter to every targeted projection the model holds, drawing A from `seed` (the
// same on every rank and stage), and freezes the rest. Before the engine takes the parameters
// over. Returns the number of adapted projections; throws Error{kConfig} for a rank below 1 or
// targets that match no projection (naming the ones that exist).
size_t attach_lora(CausalLM& model, const LoraSpec& spec, uint64_t seed);

}  // namespace dstrain::model
