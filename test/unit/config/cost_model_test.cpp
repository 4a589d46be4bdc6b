// Parameter counts from configs alone (nothing allocated) against the published totals.
#include "catch_torch.h"

#include "test_support.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/cost/pipeline_plan.h"
#include "dstrain/config/recipe.h"

using namespace dstrain::config;
using namespace dstrain::cost;

namespace {

ModelConfig v2_lite() {
  ModelConfig m;
  m.family = ModelFamily::kMlaMoe;
  m.vocab_size = 102400, m.hidden_size = 2048, m.num_layers = 27, m.num_heads = 16, m.intermediate_size = 10944;
  m.q_lora_rank = 0, m.kv_lora_rank = 512, m.qk_nope_head_dim = 128, m.qk_rope_head_dim = 64, m.v_head_dim = 128;
  m.moe_intermediate_size = 1408, m.n_routed_experts = 64, m.n_shared_experts = 2, m.num_experts_per_tok = 6, m.first_k_dense_replace = 1;
  return m;
}

ModelConfig v3() {
  ModelConfig m = v2_lite();
  m.vocab_size = 129280, m.hidden_size = 7168, m.num_layers = 61, m.num_heads = 128, m.intermediate_size = 18432;
  m.q_lora_rank = 1536, m.moe_intermediate_size = 2048, m.n_routed_experts = 256, m.n_shared_experts = 1, m.num_experts_per_tok = 8;
  m.first_k_dense_replace = 3, m.scoring_func = ScoringFunc::kSigmoid, m.topk_method = TopkMethod::kNoauxTc, m.n_group = 8,
  m.topk_group = 4;
  return m;
}

}  // namespace

TEST_CASE("dense counts equal the published totals", "[config]") {
  ModelConfig coder;
  coder.vocab_size = 32256, coder.hidden_size = 2048, coder.num_layers = 24, coder.num_heads = 16, coder.intermediate_size = 5504;
  CHECK(parameter_counts(coder).total == 1346471936);
  ModelConfig llm7b;
  llm7b.vocab_size = 102400, llm7b.hidden_size = 4096, llm7b.num_layers = 30, llm7b.num_heads = 32, llm7b.intermediate_size = 11008;
  CHECK(parameter_counts(llm7b).total == Approx(6.910e9).epsilon(5e-4));
}

TEST_CASE("MLA + MoE counts equal the published totals", "[config]") {
  const auto lite = parameter_counts(v2_lite());
  CHECK(lite.total == Approx(15.71e9).epsilon(1e-3));  // published 15.7B
  CHECK(lite.active == Approx(2.66e9).epsilon(2e-3));  // the reference's formula (2.4B excl. embeddings)
  ModelConfig v2 = v2_lite();
  v2.hidden_size = 5120, v2.num_layers = 60, v2.num_heads = 128, v2.intermediate_size = 12288, v2.q_lora_rank = 1536;
  v2.moe_intermediate_size = 1536, v2.n_routed_experts = 160, v2.topk_method = TopkMethod::kGroupLimitedGreedy, v2.n_group = 8,
  v2.topk_group = 3;
  CHECK(parameter_counts(v2).total == Approx(235.74e9).epsilon(1e-3));  // published 236B
  const auto big = parameter_counts(v3());
  CHECK(big.total == Approx(671.03e9).epsilon(1e-3));  // published 671B (without MTP)
  CHECK(big.active == Approx(37.55e9).epsilon(1e-3));  // published 37B
  ModelConfig with_mtp = v3();
  with_mtp.mtp_depth = 1;
  const auto mtp = parameter_counts(with_mtp);
  CHECK(mtp.mtp == Approx(11.5e9).epsilon(1e-2));  // README_WEIGHTS: 11.5B unique, without the shared embedding and head
  CHECK(mtp.total == big.total + mtp.mtp);
  // The released files (685B) hold the module with its copies of the embedding and head.
  CHECK(static_cast<double>(mtp.total + 2 * with_mtp.vocab_size * with_mtp.hidden_size) == Approx(685e9).epsilon(2e-3));
}

TEST_CASE("FLOPs per token follow 6N + the attention term", "[config]") {
  // The reference's worked example: DeepSeek-V2-Lite at T = 4096 is 1.81e10 FLOPs per token.
  CHECK(flops_per_token(v2_lite(), 4096) == Approx(1.81e10).epsilon(5e-3));
  ModelConfig dense;
  dense.vocab_size = 256, dense.hidden_size = 64, dense.num_layers = 2, dense.num_heads = 4, dense.intermediate_size = 128;
  const auto c = parameter_counts(dense);
  CHECK(flops_per_token(dense, 32) == Approx(6.0 * (c.active - c.embedding) + 12.0 * 2 * 4 * 16 * 32));  // PaLM: 12 L H Q T
}

TEST_CASE("a pipeline plans the MTP module on the last stage with the head", "[config][mtp]") {
  Recipe r;
  r.model = v3();
  r.data.seq_len = 4096;
  r.train.micro_batch_size = 1, r.train.gradient_accumulation_steps = 32;
  r.precision.dtype = Dtype::kBf16;
  r.parallel.pipeline_parallel_size = 16;
  r.launch.nproc_per_node = 8, r.launch.nnodes = 2;
  const PipelinePlan without = pipeline_plan(r);
  r.model.mtp_depth = 1;
  const PipelinePlan with = pipeline_plan(r);
  // The last stage's cost grows by exactly what MTP adds to the FLOPs per token, which moves a layer off it.
  CHECK(layer_costs(r.model, 4096).head - layer_costs(v3(), 4096).head ==
        Approx(flops_per_token(r.model, 4096) - flops_per_token(v3(), 4096)));
  CHECK(without.stages.back().layers == 2);
  CHECK(with.stages.back().layers == 1);
  CHECK(with.stages.back().mtp);
  CHECK_FALSE(with.stages.front().mtp);
  const ParameterCounts layer60 = decoder_layer_counts(r.model, 60);
  CHECK(with.stages.back().parameters == Approx(without.stages.back().parameters - layer60.total + parameter_counts(r.model).mtp));
  // Every stage's input carries the embeddings' output too: one [1, 4096, 7168] bf16 tensor more per held micro-batch.
  const double carried = 4096.0 * 7168 * 2;
  CHECK(with.ranks.front().activations == Approx(without.ranks.front().activations + with.ranks.front().peak_micro_batches * carried));
}
