// model.hf_config read as transformers reads a config.json: both layouts of the RoPE settings
// (transformers 4's rope_theta + rope_scaling, 5's rope_parameters), transformers' defaults for
// the keys a file omits, linear and YaRN scaling, and other RoPE types refused by name.
#include "catch_torch.h"

#include <fstream>
#include <string>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "test_support.h"

using namespace dstrain;

namespace {

// The recipe takes its model from hf.json (written from `json`).
config::Recipe load_with(const std::string& json, const test::TempDir& dir) {
  std::ofstream(dir.path() + "/data.txt") << std::string(8192, 'x');
  std::ofstream(dir.path() + "/hf.json") << json;
  std::ofstream(dir.path() + "/recipe.yaml") << "run_dir: run\ndata: {path: data.txt, seq_len: 32}\nmodel: {hf_config: hf.json}\n"
                                                "train: {steps: 10, micro_batch_size: 2}\nlaunch: {nproc_per_node: 1}\n";
  return config::load_recipe(dir.path() + "/recipe.yaml");
}

std::string error_of(const std::string& json) {
  test::TempDir dir;
  try {
    load_with(json, dir);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kConfig);
    return e.what();
  }
  FAIL("no error");
  return "";
}

}  // namespace

TEST_CASE("hf_config: transformers 5's rope_parameters holds rope_theta", "[config]") {
  test::TempDir dir;
  const config::Recipe r = load_with(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 64,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})",
                                     dir);
  CHECK(r.model.rope_theta == 500000.0);
  CHECK(r.model.rope_scaling == config::RopeScaling::kNone);
  CHECK_THAT(r.sources.at("model.rope_theta"), Catch::Contains("hf.json"));
}

TEST_CASE("hf_config: keys a DeepseekV3 config omits take transformers' DeepseekV3Config defaults", "[config]") {
  test::TempDir dir;
  // As transformers 5 saves a small V3: no scoring_func, topk_method, n_group, topk_group or norm_topk_prob.
  const config::Recipe r = load_with(R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 300, "max_position_embeddings": 64, "q_lora_rank": 32,
    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 16,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})",
                                     dir);
  CHECK(r.model.family == config::ModelFamily::kMlaMoe);
  CHECK(r.model.scoring_func == config::ScoringFunc::kSigmoid);
  CHECK(r.model.topk_method == config::TopkMethod::kNoauxTc);
  CHECK(r.model.n_group == 8);
  CHECK(r.model.topk_group == 4);
  CHECK(r.model.norm_topk_prob);
  CHECK(r.model.routed_scaling_factor == 2.5);
  CHECK(r.model.n_shared_experts == 1);
  CHECK_THAT(r.sources.at("model.topk_method"), Catch::Contains("transformers' default for deepseek_v3"));
}

TEST_CASE("hf_config: DeepseekV2Config's defaults are V2's (softmax, greedy, no renormalisation)", "[config]") {
  test::TempDir dir;
  const config::Recipe r = load_with(R"({"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 300, "max_position_embeddings": 64, "q_lora_rank": null,
    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "rope_theta": 10000.0})",
                                     dir);
  CHECK(r.model.scoring_func == config::ScoringFunc::kSoftmax);
  CHECK(r.model.topk_method == config::TopkMethod::kGreedy);
  CHECK_FALSE(r.model.norm_topk_prob);
  CHECK(r.model.q_lora_rank == 0);
  CHECK(r.model.first_k_dense_replace == 0);
  CHECK(r.model.n_shared_experts == 2);
}

TEST_CASE("hf_config: YaRN in both layouts, and linear scaling", "[config]") {
  const std::string v3 = R"("model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 300, "max_position_embeddings": 64, "q_lora_rank": 32,
    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 16,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1)";
  const std::string yarn = R"({"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 16)";
  for (const std::string& layout : {"{" + v3 + R"(, "rope_theta": 10000.0, "rope_scaling": )" + yarn + R"(, "type": "yarn"}})",
                                    "{" + v3 + R"(, "rope_parameters": )" + yarn + R"(, "rope_type": "yarn", "rope_theta": 10000.0}})"}) {
    test::TempDir dir;
    const config::Recipe r = load_with(layout, dir);
    CHECK(r.model.rope_scaling == config::RopeScaling::kYarn);
    CHECK(r.model.rope_factor == 40);
    CHECK(r.model.rope_original_max_position == 16);
    CHECK(r.model.rope_mscale == 1.0);
    CHECK(r.model.rope_mscale_all_dim == 1.0);
    CHECK(r.model.rope_beta_fast == 32);
  }
  test::TempDir dir;
  const config::Recipe coder = load_with(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 64, "rope_theta": 100000,
    "rope_scaling": {"type": "linear", "factor": 4.0}})",
                                         dir);
  CHECK(coder.model.rope_scaling == config::RopeScaling::kLinear);
  CHECK(coder.model.rope_factor == 4.0);
  CHECK(coder.model.rope_theta == 100000);
}

TEST_CASE("hf_config: RoPE types dstrain does not implement are refused by name", "[config]") {
  const std::string llama = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 300, "max_position_embeddings": 64)";
  CHECK_THAT(error_of("{" + llama + R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})"),
             Catch::Contains("rope_type 'dynamic' is not supported"));
  CHECK_THAT(error_of("{" + llama + R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}})"),
             Catch::Contains("rope_type 'llama3' is not supported"));
  CHECK_THAT(error_of("{" + llama + R"(, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})"),
             Catch::Contains("partial_rotary_factor"));
}
