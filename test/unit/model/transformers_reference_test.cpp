// Exports tiny models of each family through model::export_hf (the code under test) with inputs
// and dstrain's logits, for test/model/transformers_check.py, which loads each directory with
// Hugging Face transformers' AutoModelForCausalLM and compares the logits. Runs only when
// DSTRAIN_REFERENCE_DIR is set (the model.transformers CTest).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include "catch_torch.h"
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/tasks/export.h"

using namespace dstrain;

namespace {

config::ModelConfig dense_gqa() {
  config::ModelConfig c;
  c.vocab_size = 97, c.hidden_size = 48, c.num_layers = 2, c.num_heads = 6, c.num_kv_heads = 2, c.intermediate_size = 64,
  c.max_seq_len = 32;
  return c;
}

config::ModelConfig v3_style() {
  config::ModelConfig c;
  c.family = config::ModelFamily::kMlaMoe;
  c.vocab_size = 97, c.hidden_size = 64, c.num_layers = 3, c.num_heads = 4, c.intermediate_size = 96, c.max_seq_len = 32;
  c.q_lora_rank = 32, c.kv_lora_rank = 16, c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.v_head_dim = 16;
  c.moe_intermediate_size = 24, c.n_routed_experts = 4, c.n_shared_experts = 1, c.num_experts_per_tok = 2, c.first_k_dense_replace = 1;
  c.scoring_func = config::ScoringFunc::kSigmoid, c.topk_method = config::TopkMethod::kNoauxTc, c.n_group = 2, c.topk_group = 1;
  c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
  return c;
}

config::ModelConfig v2_lite_style() {
  config::ModelConfig c = v3_style();
  c.q_lora_rank = 0, c.scoring_func = config::ScoringFunc::kSoftmax, c.topk_method = config::TopkMethod::kGreedy, c.n_group = 1,
  c.topk_group = 1;
  c.norm_topk_prob = false, c.routed_scaling_factor = 1.0, c.n_shared_experts = 2;
  return c;
}

// YaRN as DeepSeek configures it, on a context 8 whose model runs to 32 (positions past 8 extend).
config::ModelConfig with_yarn(config::ModelConfig c, double mscale) {
  c.rope_scaling = config::RopeScaling::kYarn, c.rope_factor = 4, c.rope_original_max_position = 8;
  c.rope_mscale = mscale, c.rope_mscale_all_dim = mscale;
  return c;
}

void write_bytes(const std::string& path, const at::Tensor& t) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
}

void export_case(const std::string& root, const std::string& name, const config::ModelConfig& cfg, double tolerance = 1e-5) {
  const std::string dir = root + "/" + name;
  auto m = model::make_model(cfg, 17);
  {
    c10::NoGradGuard no_grad;  // a non-zero V3 selection bias, so that the export of it is checked too
    for (const auto& b : m->buffers()) b.tensor.copy_(at::randn({cfg.n_routed_experts}, at::detail::createCPUGenerator(4)) * 0.05);
  }
  model::export_hf(cfg, m->parameters(), m->buffers(), dir);
  const at::Tensor tokens = at::randint(0, cfg.vocab_size, {2, 24}, at::detail::createCPUGenerator(8), at::kLong);
  const at::Tensor logits = m->logits(tokens).contiguous();
  write_bytes(dir + "/tokens.bin", tokens);
  write_bytes(dir + "/logits.bin", logits);
  std::ofstream(dir + "/reference.json") << fmt::format(R"({{"tokens_shape": [{}, {}], "logits_shape": [{}, {}, {}], "tolerance": {}}})",
                                                        tokens.size(0), tokens.size(1), logits.size(0), logits.size(1), logits.size(2),
                                                        tolerance)
                                         << "\n";
}

}  // namespace

TEST_CASE("export each family for Hugging Face transformers", "[.][model-transformers-reference]") {
  const char* out = std::getenv("DSTRAIN_REFERENCE_DIR");
  // Hidden ([.]): a plain run of the unit tests does not count it; its script sets the directory.
  if (!out) FAIL("DSTRAIN_REFERENCE_DIR is not set: this case only exports data for test/model/*.sh");
  export_case(out, "dense_gqa", dense_gqa());
  export_case(out, "deepseek_v2_lite", v2_lite_style());
  export_case(out, "deepseek_v3", v3_style());
  config::ModelConfig linear = dense_gqa();
  linear.rope_scaling = config::RopeScaling::kLinear, linear.rope_factor = 4;  // deepseek-coder's scaling
  export_case(out, "dense_linear", linear);
  config::ModelConfig dense_yarn = with_yarn(dense_gqa(), 0);  // no mscale: attention factor 0.1 ln(factor) + 1
  dense_yarn.rope_theta = 50000;
  export_case(out, "dense_yarn", dense_yarn);
  export_case(out, "deepseek_v2_lite_yarn", with_yarn(v2_lite_style(), 0.707));  // V2-Lite's mscale
  export_case(out, "deepseek_v3_yarn", with_yarn(v3_style(), 1.0));              // V3's
  config::ModelConfig mtp = v3_style();  // V3 with two MTP modules: transformers skips them and gives the main model's logits
  mtp.mtp_depth = 2;
  export_case(out, "deepseek_v3_mtp", mtp, 1e-6);
}

// For test/model/fp8_test.sh: a Hugging Face folder (DeepSeek's FP8 format, written by the
// reference script) loaded by dstrain, and its logits on the folder's tokens.bin.
TEST_CASE("logits of a Hugging Face folder as dstrain loads it", "[.][model-hf-logits]") {
  const char* dir = std::getenv("DSTRAIN_HF_MODEL");
  if (!dir) FAIL("DSTRAIN_HF_MODEL is not set: this case only computes data for test/model/fp8_test.sh");
  const config::ModelConfig cfg = tasks::model_of_hf_folder(dir);
  auto m = model::make_model(cfg, 1);
  model::load_hf_weights(dir, cfg, m->parameters(), m->buffers());
  std::ifstream in(std::string(dir) + "/tokens.bin", std::ios::binary);
  std::vector<int64_t> ids(2 * 24);
  in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
  c10::NoGradGuard no_grad;
  const at::Tensor logits = m->logits(at::tensor(ids, at::kLong).view({2, 24})).contiguous();
  write_bytes(std::string(dir) + "/dstrain_logits.bin", logits);
}
