// Generation (issue 61): the key/value cache gives the logits the whole sequence gives (dense
// GQA, MLA absorbed and not, MoE, YaRN), a left-padded batch gives each prompt's own logits,
// rows stop where they should, and the sampling processors keep exactly the tokens transformers'
// keep.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/generation.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/sampling.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

// Wide initial weights: logits far apart, so that greedy choices are not near-ties.
config::ModelConfig spread(config::ModelConfig c) {
  c.init_std = 0.3;
  c.max_seq_len = 64;
  return c;
}
config::ModelConfig dense_gqa() {
  config::ModelConfig c;
  c.vocab_size = 97, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 48;
  return spread(c);
}
config::ModelConfig v2_lite() {
  config::ModelConfig c = test::tiny_v3();
  c.q_lora_rank = 0, c.scoring_func = config::ScoringFunc::kSoftmax, c.topk_method = config::TopkMethod::kGreedy, c.n_group = 1;
  c.topk_group = 1, c.norm_topk_prob = false, c.routed_scaling_factor = 1.0, c.n_shared_experts = 2;
  return spread(c);
}
config::ModelConfig v3_yarn() {
  config::ModelConfig c = spread(test::tiny_v3());
  c.rope_scaling = config::RopeScaling::kYarn, c.rope_factor = 4, c.rope_original_max_position = 16;
  c.rope_mscale = 1, c.rope_mscale_all_dim = 1;
  return c;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 9, 2, 44, 17, 3, 80}, {11}, {7, 7, 7, 20}};

std::vector<at::Tensor> logits_of(const model::CausalLM& m, const std::vector<std::vector<int64_t>>& prompts, bool cache, int64_t n = 12) {
  std::vector<at::Tensor> steps;
  model::GenerateOptions o;
  o.max_new_tokens = n;
  o.use_cache = cache;
  o.step_logits = &steps;
  model::generate(m, prompts, o, c10::Device(c10::kCPU));
  return steps;
}

// Within 1e-5 of the logits' scale (fp32 rounding: the cached path sums in another order).
bool close(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<float>() <= 1e-5 * std::max(1.0f, b.abs().max().item<float>());
}

void check_cache_equals_full_forward(const model::CausalLM& m) {
  const auto cached = logits_of(m, kPrompts, true), full = logits_of(m, kPrompts, false);
  REQUIRE(cached.size() == full.size());
  for (size_t s = 0; s < cached.size(); ++s) {
    INFO("step " << s << ": largest difference " << (cached[s] - full[s]).abs().max().item<float>() << " of "
                 << full[s].abs().max().item<float>());
    CHECK(close(cached[s], full[s]));
  }
  // Each prompt alone: the batch's row (left padding changes nothing but rounding).
  for (size_t r = 0; r < kPrompts.size(); ++r) {
    const auto alone = logits_of(m, {kPrompts[r]}, true);
    for (size_t s = 0; s < alone.size(); ++s) {
      INFO("row " << r << ", step " << s << ": largest difference "
                  << (alone[s][0] - cached[s][static_cast<int64_t>(r)]).abs().max().item<float>() << " of "
                  << alone[s].abs().max().item<float>());
      CHECK(close(cached[s][static_cast<int64_t>(r)], alone[s][0]));
    }
  }
}

}  // namespace

TEST_CASE("generation: the key/value cache gives the whole sequence's logits, alone or left-padded in a batch", "[model][generate]") {
  SECTION("dense with grouped KV heads") { check_cache_equals_full_forward(*model::make_model(dense_gqa(), 3)); }
  SECTION("MLA without q_lora (V2-Lite), MoE with softmax routing: the absorbed latent cache") {
    check_cache_equals_full_forward(*model::make_model(v2_lite(), 3));
  }
  SECTION("MLA with q_lora, sigmoid group routing and YaRN") { check_cache_equals_full_forward(*model::make_model(v3_yarn(), 3)); }
  SECTION("MLA with LoRA on kv_b: per-head keys from the cached latents") {
    auto m = model::make_model(v2_lite(), 3);
    model::LoraSpec spec;
    spec.rank = 4, spec.alpha = 8, spec.targets = {"kv_b_proj", "q_proj"};
    REQUIRE(model::attach_lora(*m, spec, 5) > 0);
    c10::NoGradGuard no_grad;
    for (const auto& p : m->parameters())  // B starts at zero; make the adapters matter
      if (p.name.find(".lora_B.") != std::string::npos) p.tensor.normal_(0, 0.3);
    const auto with = logits_of(*m, kPrompts, true);
    check_cache_equals_full_forward(*m);
    model::AdaptersOff off;
    const auto without = logits_of(*m, kPrompts, true);
    CHECK_FALSE(at::allclose(with.front(), without.front(), 1e-3, 1e-3));
    check_cache_equals_full_forward(*m);  // adapters off: the absorbed path again
  }
}

TEST_CASE("generation: rows stop at a stop id or the caller's check, else after max_new_tokens", "[model][generate]") {
  const auto m = model::make_model(dense_gqa(), 3);
  model::GenerateOptions o;
  o.max_new_tokens = 10;
  const auto free_run = model::generate(*m, kPrompts, o, c10::Device(c10::kCPU));
  for (const auto& g : free_run) CHECK((g.tokens.size() == 10 && g.finish_reason == "length"));
  // Stop at row 0's third token: row 0 ends there (the id included); the others where it first appears.
  o.stop_ids = {free_run[0].tokens[2]};
  const auto stopped = model::generate(*m, kPrompts, o, c10::Device(c10::kCPU));
  CHECK(stopped[0].tokens == std::vector<int64_t>(free_run[0].tokens.begin(), free_run[0].tokens.begin() + 3));
  CHECK((stopped[0].finish_reason == "stop" && stopped[0].stopped_by_id));
  for (size_t r = 1; r < kPrompts.size(); ++r) {  // the rows agree with the free run up to their end
    CHECK(std::equal(stopped[r].tokens.begin(), stopped[r].tokens.end(), free_run[r].tokens.begin()));
    CHECK((stopped[r].finish_reason == "stop") == (stopped[r].tokens.size() < 10));
  }
  o.stop_ids.clear();
  o.stop_check = [](size_t row, const std::vector<int64_t>& generated) { return row == 1 && generated.size() == 4; };
  const auto checked = model::generate(*m, kPrompts, o, c10::Device(c10::kCPU));
  CHECK((checked[1].tokens.size() == 4 && checked[1].finish_reason == "stop" && !checked[1].stopped_by_id));
  CHECK(checked[0].tokens == free_run[0].tokens);
}

TEST_CASE("sampling: the processors keep exactly the tokens transformers' keep", "[model][generate]") {
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor logits = at::tensor({1.f, 3.f, 2.f, 3.f, 0.f}).view({1, 5});
  CHECK(at::equal(model::apply_top_k(logits, 2), at::tensor({-inf, 3.f, -inf, 3.f, -inf}).view({1, 5})));  // ties with the k-th stay
  CHECK(at::equal(model::apply_top_k(logits, 3), at::tensor({-inf, 3.f, 2.f, 3.f, -inf}).view({1, 5})));
  CHECK(at::equal(model::apply_top_k(logits, 0), logits));
  const at::Tensor probs = at::tensor({0.5, 0.25, 0.15, 0.1}, at::kDouble).log().to(at::kFloat).view({1, 4});
  auto kept = [&](double p) { return model::apply_top_p(probs, p).isfinite().to(at::kLong).view({4}); };
  // Ascending cumulative probabilities 0.1, 0.25, 0.5, 1: removed where <= 1 - p.
  CHECK(at::equal(kept(0.8), at::tensor({1, 1, 1, 0}, at::kLong)));
  CHECK(at::equal(kept(0.7), at::tensor({1, 1, 0, 0}, at::kLong)));
  CHECK(at::equal(kept(0.4), at::tensor({1, 0, 0, 0}, at::kLong)));
  CHECK(at::equal(kept(0.0), at::tensor({1, 0, 0, 0}, at::kLong)));  // the most likely token always stays
  CHECK(at::equal(kept(1.0), at::tensor({1, 1, 1, 1}, at::kLong)));
  const at::Tensor penalised =
      model::apply_repetition_penalty(at::tensor({2.f, -2.f, 1.f}).view({1, 3}), at::tensor({0L, 1L, 1L}).view({1, 3}), 2.0);
  CHECK(at::equal(penalised, at::tensor({1.f, -4.f, 1.f}).view({1, 3})));  // divided when positive, multiplied when negative, once

  model::SamplingOptions o;
  o.temperature = 1.0;
  auto draws = [&](uint64_t seed, const model::SamplingOptions& opts) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 2000; ++i) out.push_back(model::next_tokens(probs, {}, opts, g).item<int64_t>());
    return out;
  };
  const auto a = draws(7, o);
  CHECK(a == draws(7, o));  // a seed gives the same tokens
  CHECK(a != draws(8, o));
  std::vector<double> freq(4, 0);
  for (const int64_t t : a) freq[static_cast<size_t>(t)] += 1.0 / 2000;
  for (size_t i = 0; i < 4; ++i) CHECK(std::abs(freq[i] - std::vector<double>{0.5, 0.25, 0.15, 0.1}[i]) < 0.04);
  o.top_p = 0.7;  // only the two most likely tokens can come
  for (const int64_t t : draws(7, o)) CHECK(t <= 1);
  o.top_p = 1.0, o.top_k = 1;
  for (const int64_t t : draws(7, o)) CHECK(t == 0);
  model::SamplingOptions greedy;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
  CHECK(model::next_tokens(logits, {}, greedy, g).item<int64_t>() == 1);
}
