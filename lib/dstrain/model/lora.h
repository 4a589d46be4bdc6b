#pragma once
// Low-rank adapters on a model's projections (LoRA, Hu et al. 2021; rsLoRA, Kalajdzievski 2023),
// computed as PEFT computes them: y = base(x) + (dropout(x) Aᵀ) Bᵀ · scale, scale = alpha / r (alpha / √r
// with rsLoRA); A [r, in] Kaiming-uniform (a = √5, PEFT's init: U(-1/√in, 1/√in)), B [out, r]
// zeros, so a fresh adapter leaves the model's output bitwise unchanged. Each A and B is a
// parameter of role `adapter` in its projection's layer group (ZeRO-3 gathers it with the layer;
// a pipeline stage holds its own), under PEFT's key names: <module>.lora_A.weight and
// <module>.lora_B.weight (DoRA: and <module>.lora_magnitude_vector). Every other parameter is frozen but the modules to save: the engine
// keeps gradients and optimizer states for those and the adapters only. The recipe's `lora:`
// block (config::LoraConfig) gives the spec.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
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
  // Modules trained in full (PEFT's modules_to_save): a parameter trains when its module's name
  // is one of these or ends with "." and one of these.
  std::vector<std::string> modules_to_save;
  // DoRA: a trained magnitude per output row, <module>.lora_magnitude_vector [out] (PEFT's key),
  // starting at W's row norms.
  bool dora = false;
  // PEFT's lora_dropout on the adapters' input in training forwards: each row's mask drawn from the
  // seed, the projection and the row's place in the global sample order (model::TrainingRows),
  // so that every layout of the same global batch drops the same elements.
  double dropout = 0;
  // Per-module rank and alpha (PEFT's rank_pattern, alpha_pattern; config::LoraConfig).
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  // The routed experts' projections that targets names (gate_proj, up_proj, down_proj; all-linear:
  // all three) get adapters too, per expert: <prefix>.experts.<e>.gate_proj.lora_A.weight, ...,
  // with the spec's rank and alpha (no patterns: PEFT fuses them at r), in the expert's block.
  bool experts = false;
};

LoraSpec lora_spec_of(const config::LoraConfig& config);

// A projection's rank and alpha: the spec's, or those its patterns give the module, matched as
// PEFT's get_pattern_key matches: the whole name against (.*\.)?(pattern). Throws Error{kConfig}
// for a pattern that is no regular expression, or two that give the module different values.
struct ModuleLora {
  int64_t rank = 0;
  double alpha = 0;
};
ModuleLora lora_of(const LoraSpec& spec, const std::string& module);

// PEFT's lora_dropout (torch's Dropout: kept elements scaled by 1 / (1 - p)) on an adapter's input
// x ([rows, ...] in the current TrainingRows' order) in a training forward; x itself otherwise.
// Each row's mask comes from a generator seeded by `stream` and the row's place in the global
// sample order, so a row drops the same elements wherever it is computed.
at::Tensor lora_dropout(const at::Tensor& x, double p, uint64_t stream);

double lora_scale(const LoraSpec& spec);  // with the spec's own rank and alpha
double lora_scale(const LoraSpec& spec, const ModuleLora& module);
// DoRA's row norms of W + scale · lora_weight (lora_weight = B A, [out, in]), 1 where a row is zero.
at::Tensor dora_row_norms(const at::Tensor& weight, const at::Tensor& lora_weight, double scale);
// Whether a projection of `model` gets an adapter: its module's last part is a target
// (all-linear: any but the router's), and it is not in the final group (the MTP modules beside
// the head). The routed experts' are no Linears: spec.experts adapts them.
bool lora_targets(const LoraSpec& spec, const CausalLM& model, const Linear& linear);
// Whether a parameter (or checkpoint tensor) is an adapter's: <module>.lora_A.weight,
// .lora_B.weight or DoRA's .lora_magnitude_vector.
bool is_adapter_name(const std::string& name);
// Where the expert's index starts in a routed expert's module or parameter name
// (model.layers.3.mlp.experts.<index>.gate_proj...), or npos for any other name (shared experts too).
size_t routed_expert_index_at(const std::string& name);
// The projection whose A a parameter (or checkpoint tensor) named <module>.lora_A.weight is, or ""
// for any other name: one per adapted projection.
std::string lora_a_module(const std::string& name);
// Whether parameter `name` belongs to one of the spec's modules to save.
bool lora_saves(const LoraSpec& spec, const std::string& name);
// Attaches an adapter to every targeted projection the model holds, drawing A from `seed` (the
// same on every rank and stage), and freezes the rest but the modules to save. Before the engine
// takes the parameters over. Returns the number of adapted projections (the routed experts' each
// count); throws Error{kConfig} for a rank below 1, targets or modules to save that match nothing
// (naming what exists), or a rank or alpha pattern that matches a routed expert.
size_t attach_lora(CausalLM& model, const LoraSpec& spec, uint64_t seed);

// One log line: the adapters' rank and scale, the projections adapted, what trains and what is
// frozen (in this model: a pipeline stage's part).
std::string describe_lora(const CausalLM& model, const LoraSpec& spec, size_t adapted);

// A LoRA run on a Hugging Face base (model.init_from) checkpoints what trains only: the frozen
// base is named (its folder and files' checksums, ckpt::BaseModel) and read from there again.
// Without model.init_from the base is the run's own random initialisation, saved whole.
bool lora_checkpoints_name_base(const config::Recipe& recipe);

// What lora freezes and adds in a model of `recipe` (recipe.lora enabled), by layer group, from
// the model's declared parameters (nothing allocated); the checks of attach_lora.
config::FrozenCounts lora_counts(const config::Recipe& recipe);

}  // namespace dstrain::model
