#pragma once
// The cost model's numbers from a resolved config, nothing allocated: parameter counts, training
// FLOPs (per token and per layer), the model-state memory per rank from the ZeRO paper's
// formulas and an activation estimate. The pipeline's plan (pipeline_plan.h), the memory plan
// (memory_plan.h) and --dry-run (dry_run.h) build on them; telemetry's MFU and the launcher's
// memory checks read them.
#include <cstdint>
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/pipeline/stage_split.h"

namespace dstrain::cost {

using config::ModelConfig;
using config::Recipe;

// Parameter counts from the config alone (nothing is allocated), with the formulas of the
// architecture reference: dense LLaMA-style with grouped KV heads; MLA + DeepSeekMoE.
struct ParameterCounts {
  int64_t total;       // every parameter
  int64_t active;      // those a token uses (MoE: top-k routed + shared experts)
  int64_t embedding;   // the input embedding (a gather, not a matmul)
  int64_t routed = 0;  // MoE: the routed experts' (what expert parallelism spreads over ranks)
  int64_t mtp = 0;     // the multi-token prediction modules' (included in total)
};
ParameterCounts parameter_counts(const ModelConfig& model);
// The head's rows: the vocabulary, or 1 for a reward model's score (model.score_head).
int64_t head_rows(const ModelConfig& model);
// One decoder layer's (0-based): its total, active and routed-expert parameters (embedding 0).
ParameterCounts decoder_layer_counts(const ModelConfig& model, int64_t layer);
// The multi-token prediction modules' together (every depth; embedding 0, mtp = total): each
// enorm, hnorm, eh_proj [H, 2H], a decoder block (HF's layer L + k - 1) and shared_head.norm; the
// embedding and head are the main model's.
ParameterCounts mtp_module_counts(const ModelConfig& model);

// Training FLOPs per token: 6 x (active parameters less the input embedding) plus the attention
// term 6 L n_h T (d_qk + d_v) (PaLM's 12 L H Q T when d_qk = d_v), no causal discount; each MTP
// depth adds its module, one more pass through the head and one layer's attention.
double flops_per_token(const ModelConfig& model, int64_t seq_len);
// The attention term of one layer: 6 n_h T (d_qk + d_v).
double attention_flops_per_token(const ModelConfig& model, int64_t seq_len);

struct ModelStateMemory {
  double device_bytes;  // per rank, on the training device
  double host_bytes;    // per rank, in host memory (optimizer offload)
};
// The parameters one rank holds and shards: with expert parallelism (moe.expert_parallel_size E)
// a rank holds 1/E of the routed experts, sharded over world / E ranks; the rest over the world.
struct RankParameters {
  double dense = 0, experts = 0;                      // held: every non-routed parameter, this rank's experts
  double dense_ranks = 1, expert_ranks = 1;           // the ranks each is data-parallel (ZeRO-sharded) over
  double frozen_dense = 0, frozen_experts = 0;        // of those, frozen (train.freeze: Recipe::frozen)
  double quantized_dense = 0, quantized_experts = 0;  // of the frozen, kept quantized (lora.base), not sharded
  double shard = 0;                                   // the elements this rank's optimizer steps (stage 0: all it holds that train)
};
RankParameters rank_parameters(const Recipe& recipe);

// Parameters, gradients and optimizer state per rank (activations and buffers are extra):
// mixed precision (bf16/fp16): 2 + 2 + 12 bytes per parameter, fp32: 4 + 4 + 12; stage 1
// partitions the optimizer state, stage 2 also gradients, stage 3 also parameters. A frozen
// parameter costs its own bytes only. preference.reference live without LoRA adds a frozen copy.
ModelStateMemory model_state_memory(const Recipe& recipe);
// The same for given parameter counts: `dense` sharded over `dense_ranks`, `experts` over
// `expert_ranks`, of which frozen_dense and frozen_experts are frozen.
// Of the frozen, quantized_dense and quantized_experts are kept in lora.base's storage instead:
// lora_base_bytes_per_element each, held whole (outside ZeRO).
ModelStateMemory model_state_bytes(const Recipe& recipe, double dense, double dense_ranks, double experts, double expert_ranks,
                                   double frozen_dense = 0, double frozen_experts = 0, double quantized_dense = 0,
                                   double quantized_experts = 0);
// What a frozen projection's weight takes per element in lora.base's storage: NF4 half a byte and
// its double-quantized block maxima (1 + 4 / 256 bytes per 64); FP8 a byte and a float32 scale
// per 128 x 128 block; the model's dtype otherwise.
double lora_base_bytes_per_element(const Recipe& recipe);

// Activation memory per rank for one micro-batch (bytes), a rough estimate: what a decoder layer
// keeps for backward (34 H bytes per token at 16 bits, Korthikanti et al., without recomputation;
// + 5 heads T for the attention scores when data.document_mask rules out fused attention) in
// the training dtype, as train.activation_checkpointing reduces it, plus what the loss holds
// (the logits, or one chunk of them and the head's gradient: train.loss_chunk_tokens).
double activation_bytes_estimate(const Recipe& recipe);
// The same in parts: what each decoder layer keeps per micro-batch, what one layer's recompute
// needs while it runs (full recompute), and what the loss holds. The estimate is
// (num_layers + mtp_depth) x per_layer + working + loss x (1 + mtp_depth): each MTP depth one layer and one loss more.
struct ActivationParts {
  double per_layer = 0, working = 0, loss = 0;
};
ActivationParts activation_parts(const Recipe& recipe);

// Each decoder layer's training FLOPs per token; the embedding's (0: a gather) and the head's
// (the LM head's 6 V H and the final norm) apart.
pipeline::LayerCosts layer_costs(const ModelConfig& model, int64_t seq_len);

// Stage 3 offload_param (with offload_optimizer): the parameter shard is host memory.
bool param_shard_on_host(const Recipe& recipe);

// A byte count for people: "845.3 KiB", "12.9 GiB" (powers of 1024, one decimal).
std::string bytes_text(double bytes);
// A count for people: "845.3k", "12.90B" (powers of 1000).
std::string count_text(double count);

}  // namespace dstrain::cost
