#pragma once
// Tiny model configurations shared by the model tests.
#include "dstrain/config/recipe.h"

namespace dstrain::test {

// The reference's suggested tiny V3 shape: hidden 64, 2 layers, 4 experts, q_lora 32, kv_lora 16,
// rope 8, nope 16, v 16 (here 3 layers so that two are MoE).
inline config::ModelConfig tiny_v3() {
  config::ModelConfig c;
  c.family = config::ModelFamily::kMlaMoe;
  c.vocab_size = 97, c.hidden_size = 64, c.num_layers = 3, c.num_heads = 4, c.intermediate_size = 96, c.max_seq_len = 16;
  c.q_lora_rank = 32, c.kv_lora_rank = 16, c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 16;
  c.moe_intermediate_size = 24, c.n_routed_experts = 4, c.n_shared_experts = 1, c.num_experts_per_tok = 2, c.first_k_dense_replace = 1;
  c.scoring_func = config::ScoringFunc::kSigmoid, c.topk_method = config::TopkMethod::kNoauxTc, c.n_group = 2, c.topk_group = 1,
  c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
  c.aux_loss_alpha = 0.01;
  return c;
}

}  // namespace dstrain::test
