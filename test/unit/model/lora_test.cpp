// LoRA on the model's projections (model/lora.h): a fresh adapter leaves the logits bitwise
// unchanged; with B non-zero the forward equals the merged model W + scale·B·A, and the adapters'
// gradients equal the merged weight's gradient carried through (dL/dB = s·G·Aᵀ, dL/dA = s·Bᵀ·G);
// only adapters train; every parallel mode trains them as one process and leaves the base bitwise
// unchanged.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <string>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/linear.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/lora.h"
#include "engine_harness.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

// A spec by its fields (aggregate initialisation would have to name every field there is).
model::LoraSpec spec_of(int64_t rank, double alpha, std::vector<std::string> targets = {"all-linear"}, bool rslora = false,
                        std::vector<std::string> save = {}) {
  model::LoraSpec spec;
  spec.rank = rank, spec.alpha = alpha, spec.targets = std::move(targets), spec.rslora = rslora, spec.modules_to_save = std::move(save);
  return spec;
}

at::Tensor tokens_of(int64_t vocab) { return at::randint(0, vocab, {2, 12}, at::detail::createCPUGenerator(5), at::kLong); }

std::map<std::string, at::Tensor> by_name(const model::CausalLM& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.parameters()) out[p.name] = p.tensor;
  return out;
}

// The merged model's weights are what the gradient is taken of: both models' mean losses agree
// (float64), and both go backward.
void backward_both(model::CausalLM& adapted, model::CausalLM& merged, std::map<std::string, at::Tensor>& reference,
                   const at::Tensor& tokens) {
  const at::Tensor labels = at::roll(tokens, -1, 1);
  for (auto& [name, t] : reference) t.requires_grad_(true);
  const at::Tensor ours = model::mean_loss(adapted, tokens, labels), theirs = model::mean_loss(merged, tokens, labels);
  CHECK(ours.item<double>() == Approx(theirs.item<double>()).epsilon(1e-12));
  ours.backward();
  theirs.backward();
}

}  // namespace

TEST_CASE("LoRA: fresh adapters leave the logits bitwise unchanged; names, places and freezing", "[model]") {
  for (const bool moe : {false, true}) {
    DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense")) {
      const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
      auto base = model::make_model(cfg, 3), adapted = model::make_model(cfg, 3);
      const size_t before = adapted->parameters().size();
      const size_t n = model::attach_lora(*adapted, spec_of(4, 8.0), 11);
      CHECK(adapted->parameters().size() == before + 2 * n);
      const at::Tensor tokens = tokens_of(cfg.vocab_size);
      CHECK(at::equal(adapted->logits(tokens), base->logits(tokens)));
      int previous_group = 0;
      for (size_t i = 0; i < adapted->parameters().size(); ++i) {
        const auto& name = adapted->parameters()[i].name;
        const model::ParamPlace& place = adapted->parameter_places()[i];
        const bool adapter = name.find(".lora_") != std::string::npos;
        CHECK(adapter == (place.role == model::ParamRole::kAdapter));
        CHECK(place.trains == adapter);        // everything else frozen
        CHECK(place.group >= previous_group);  // the engine's order: groups never go back
        previous_group = place.group;
        CHECK_FALSE((adapter && (name.find(".mlp.experts.") != std::string::npos || name.find(".mlp.gate.") != std::string::npos)));
      }
      for (model::Linear* l : adapted->linears()) CHECK(adapted->parameters()[l->index].name == l->module + ".weight");
      CHECK(adapted->linear("model.layers.0.self_attn.o_proj")->adapters.size() == 1);
    }
  }
}

TEST_CASE("LoRA: the forward and the adapters' gradients equal the merged model's (float64)", "[model]") {
  for (const bool rslora : {false, true}) {
    for (const bool moe : {false, true}) {
      for (const bool patterns : {false, true}) {
        DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense") << (rslora ? ", rsLoRA" : "") << (patterns ? ", rank and alpha patterns" : "")) {
          const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
          model::LoraSpec spec = spec_of(4, 16.0, {"q_proj", "q_b_proj", "kv_b_proj", "o_proj", "down_proj"}, rslora);
          CHECK(model::lora_scale(spec) == Approx(rslora ? 8.0 : 4.0));
          if (patterns) spec.rank_pattern = {{"layers\\.1\\..*o_proj", 2}}, spec.alpha_pattern = {{"down_proj", 3.0}};
          auto adapted = model::make_model(cfg, 3, at::kDouble), merged = model::make_model(cfg, 3, at::kDouble);
          REQUIRE(model::attach_lora(*adapted, spec, 11) > 0);
          std::map<std::string, at::Tensor> params = by_name(*adapted), reference = by_name(*merged);
          at::Generator g = at::detail::createCPUGenerator(21);
          {
            c10::NoGradGuard no_grad;
            for (model::Linear* l : adapted->linears()) {
              if (l->adapters.empty()) continue;
              at::Tensor b = params.at(l->module + ".lora_B.weight");
              b.copy_(at::randn(b.sizes(), g, at::kDouble) * 0.1);
              const double scale = model::lora_scale(spec, model::lora_of(spec, l->module));
              reference.at(l->module + ".weight").add_(at::mm(b, params.at(l->module + ".lora_A.weight")) * scale);
            }
          }
          const at::Tensor tokens = tokens_of(cfg.vocab_size);
          backward_both(*adapted, *merged, reference, tokens);
          for (model::Linear* l : adapted->linears()) {
            if (l->adapters.empty()) {
              CHECK_FALSE(adapted->parameters()[l->index].tensor.requires_grad());
              continue;
            }
            const at::Tensor grad_w = reference.at(l->module + ".weight").grad();
            const at::Tensor a = params.at(l->module + ".lora_A.weight"), b = params.at(l->module + ".lora_B.weight");
            INFO(l->module);
            const model::ModuleLora own = model::lora_of(spec, l->module);
            const double scale = model::lora_scale(spec, own);
            CHECK(a.size(0) == own.rank);
            if (patterns && l->module == "model.layers.1.self_attn.o_proj") CHECK(own.rank == 2);
            if (patterns && l->module.find("down_proj") != std::string::npos) CHECK(scale == Approx(rslora ? 3.0 / 2.0 : 3.0 / 4.0));
            CHECK(at::allclose(b.grad(), at::mm(grad_w, a.t()) * scale, 1e-9, 1e-12));
            CHECK(at::allclose(a.grad(), at::mm(b.t(), grad_w) * scale, 1e-9, 1e-12));
            CHECK_FALSE(l->weight.grad().defined());  // the base has no gradient
          }
        }
      }
    }
  }
}

TEST_CASE("LoRA: rank and alpha patterns match as PEFT's get_pattern_key; clashing, unused or broken patterns are refused", "[model]") {
  model::LoraSpec spec = spec_of(4, 8.0);
  spec.rank_pattern = {{"q_proj", 8}, {"model.layers.1.mlp.down_proj", 2}, {"^model.layers.0.self_attn.o_proj", 6}};
  spec.alpha_pattern = {{"layers\\.(0|1)\\.self_attn\\.k_proj", 32.0}};
  const auto of = [&](const std::string& m) { return model::lora_of(spec, m); };
  CHECK(of("model.layers.0.self_attn.q_proj").rank == 8);  // a last dotted part
  CHECK(of("model.layers.1.mlp.down_proj").rank == 2);     // the whole name
  CHECK(of("model.layers.0.mlp.down_proj").rank == 4);
  CHECK(of("model.layers.0.self_attn.o_proj").rank == 6);  // ^ anchors at the name's start
  CHECK(of("model.layers.1.self_attn.o_proj").rank == 4);
  CHECK(of("model.layers.1.self_attn.k_proj").alpha == 32.0);
  CHECK(of("model.layers.1.self_attn.k_proj").rank == 4);
  CHECK(of("model.layers.1.self_attn.v_proj").alpha == 8.0);
  CHECK(of("model.layers.0.self_attn.xq_proj").rank == 4);  // a part matches whole, not its end
  auto m = model::make_model(test::tiny_model_config(), 3);
  model::attach_lora(*m, spec, 1);
  CHECK(by_name(*m).at("model.layers.0.self_attn.q_proj.lora_A.weight").size(0) == 8);
  CHECK(by_name(*m).at("model.layers.1.mlp.down_proj.lora_B.weight").size(1) == 2);
  CHECK_THAT(model::describe_lora(*m, spec, 14), Catch::Contains("on 14 projections (all-linear), 6 of them with their own rank or alpha"));

  model::LoraSpec clash = spec_of(4, 8.0);
  clash.rank_pattern = {{"q_proj", 8}, {"self_attn\\.q_proj", 16}, {"v_proj", 2}, {"layers\\.0\\.self_attn\\.v_proj", 2}};
  CHECK_THROWS_WITH(
      model::lora_of(clash, "model.layers.0.self_attn.q_proj"),
      Catch::Contains("lora.rank_pattern: 'q_proj' and 'self_attn\\.q_proj' both match model.layers.0.self_attn.q_proj, with 8 "
                      "and 16"));
  CHECK(model::lora_of(clash, "model.layers.0.self_attn.v_proj").rank == 2);  // two patterns, one rank: no clash
  model::LoraSpec unused = spec_of(4, 8.0, {"q_proj", "k_proj"});
  unused.alpha_pattern = {{"o_proj", 4.0}};  // a projection lora.targets does not adapt
  auto fresh = model::make_model(test::tiny_model_config(), 3);
  CHECK_THROWS_WITH(model::attach_lora(*fresh, unused, 1), Catch::Contains("lora.alpha_pattern: 'o_proj' matches no adapted projection"));
  model::LoraSpec broken = spec_of(4, 8.0);
  broken.rank_pattern = {{"q_proj(", 8}};
  CHECK_THROWS_WITH(model::lora_of(broken, "model.layers.0.self_attn.q_proj"),
                    Catch::Contains("lora.rank_pattern: 'q_proj(' is no regular expression"));
}

TEST_CASE("LoRA: a target that matches nothing, or a rank below 1, is refused naming what exists", "[model]") {
  auto m = model::make_model(test::tiny_model_config(), 3);
  try {
    model::attach_lora(*m, spec_of(4, 8.0, {"q_a_proj"}), 1);
    FAIL("a target that matches nothing was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kConfig);
    CHECK_THAT(e.what(), Catch::Contains("lora.targets [q_a_proj] match no projection"));
    CHECK_THAT(e.hint(), Catch::Contains("down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"));
  }
  CHECK_THROWS_WITH(model::attach_lora(*m, spec_of(0, 8.0), 1), Catch::Contains("lora.rank 0"));
}

TEST_CASE("LoRA under the ZeRO engine: every stage and 2 ranks train the adapters as one process; the base stays bitwise", "[zero]") {
  test::EngineSpec one;
  one.lora_rank = 4, one.steps = 6, one.lr = 5e-2;
  const test::EngineRun reference = test::run_engine(one);
  REQUIRE(reference.losses.size() == 6);
  CHECK(reference.losses.back() < reference.losses.front());  // the adapters learn
  for (const int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("ZeRO-" << stage << " on 2 ranks") {
      test::EngineSpec two = one;
      two.world = 2, two.stage = stage;
      const test::EngineRun run = test::run_engine(two);
      CHECK(test::worst_relative(run.losses, reference.losses) <= 1e-5);
      // The base: every non-adapter value as it started; the adapters moved.
      int64_t offset = 0, adapter_elements = 0;
      for (size_t i = 0; i < run.names.size(); ++i) {
        const at::Tensor now = run.master.narrow(0, offset, run.numels[i]), then = run.initial.narrow(0, offset, run.numels[i]);
        const bool adapter = run.names[i].find(".lora_") != std::string::npos;
        INFO(run.names[i]);
        if (adapter) adapter_elements += run.numels[i];
        if (!adapter) CHECK(at::equal(now, then));
        if (run.names[i].find(".lora_B.") != std::string::npos) CHECK_FALSE(at::equal(now, then));
        offset += run.numels[i];
      }
      // Adam's two moments for the adapters alone.
      CHECK(run.exp_avg_sq.numel() == adapter_elements);
    }
  }
}

TEST_CASE(
    "LoRA on the routed experts (lora.experts): each expert's adapters beside its weights in its block; fresh, the logits are "
    "bitwise the base's; the forward and gradients equal the merged model's (float64)",
    "[model]") {
  const config::ModelConfig cfg = test::tiny_v3();
  model::LoraSpec spec = spec_of(4, 16.0, {"q_b_proj", "gate_proj", "up_proj", "down_proj"});
  spec.experts = true;
  auto base = model::make_model(cfg, 3, at::kDouble), adapted = model::make_model(cfg, 3, at::kDouble),
       merged = model::make_model(cfg, 3, at::kDouble);
  const size_t before = adapted->parameters().size();
  const size_t n = model::attach_lora(*adapted, spec, 11);
  // q_b_proj in 3 layers, the dense layer's and 2 shared experts' MLPs (3 each), 2 MoE layers x 4 experts x 3.
  CHECK(n == 3 + 3 * 3 + 2 * 4 * 3);
  CHECK(adapted->parameters().size() == before + 2 * n);
  const at::Tensor tokens = tokens_of(cfg.vocab_size);
  CHECK(at::equal(adapted->logits(tokens), base->logits(tokens)));
  size_t routed = 0;
  for (size_t i = 0; i + 2 < adapted->parameters().size(); ++i) {
    const std::string& name = adapted->parameters()[i].name;
    const model::ParamPlace& place = adapted->parameter_places()[i];
    if (place.expert < 0 || place.role == model::ParamRole::kAdapter) continue;
    INFO(name);
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    CHECK_FALSE(place.trains);
    for (const auto& [offset, part] : {std::pair{1, ".lora_A.weight"}, std::pair{2, ".lora_B.weight"}}) {
      const auto k = i + static_cast<size_t>(offset);
      const model::ParamPlace& at = adapted->parameter_places()[k];
      CHECK(adapted->parameters()[k].name == module + part);
      CHECK((at.role == model::ParamRole::kAdapter && at.trains && at.expert == place.expert && at.group == place.group));
      // Its name in another rank's block: the expert's global index replaced.
      const std::string other = adapted->expert_parameter_name(k, 3);
      CHECK(other.find(".mlp.experts.3.") != std::string::npos);
      CHECK(other.substr(other.size() - std::string(part).size()) == part);
    }
    ++routed;
  }
  CHECK(routed == 2 * 4 * 3);
  CHECK_THAT(model::describe_lora(*adapted, spec, n), Catch::Contains("on 36 projections (q_b_proj, gate_proj, up_proj, down_proj; "
                                                                      "24 of them the routed experts' here)"));
  // B non-zero: the merged model W + s·B·A gives the loss, and the adapters the merged weights' gradient carried through.
  std::map<std::string, at::Tensor> params = by_name(*adapted), reference = by_name(*merged);
  const double scale = model::lora_scale(spec);
  at::Generator g = at::detail::createCPUGenerator(21);
  std::vector<std::string> modules;
  {
    c10::NoGradGuard no_grad;
    for (auto& [name, b] : params) {
      if (name.find(".lora_B.weight") == std::string::npos) continue;
      const std::string module = name.substr(0, name.size() - std::string(".lora_B.weight").size());
      b.copy_(at::randn(b.sizes(), g, at::kDouble) * 0.1);
      reference.at(module + ".weight").add_(at::mm(b, params.at(module + ".lora_A.weight")) * scale);
      modules.push_back(module);
    }
  }
  backward_both(*adapted, *merged, reference, tokens);
  for (const std::string& module : modules) {
    INFO(module);
    const at::Tensor w = reference.at(module + ".weight");
    const at::Tensor grad_w = w.grad().defined() ? w.grad() : at::zeros_like(w);  // an expert without tokens: none
    const at::Tensor a = params.at(module + ".lora_A.weight"), b = params.at(module + ".lora_B.weight");
    const auto grad = [](const at::Tensor& t) { return t.grad().defined() ? t.grad() : at::zeros_like(t); };
    CHECK(at::allclose(grad(b), at::mm(grad_w, a.t()) * scale, 1e-9, 1e-12));
    CHECK(at::allclose(grad(a), at::mm(b.t(), grad_w) * scale, 1e-9, 1e-12));
  }
}

TEST_CASE(
    "LoRA on the routed experts: refused on a model without them, without their projections in targets, or with a pattern "
    "that matches one",
    "[model]") {
  model::LoraSpec spec = spec_of(4, 8.0, {"q_proj"});
  spec.experts = true;
  auto dense = model::make_model(test::tiny_model_config(), 3);
  CHECK_THROWS_WITH(model::attach_lora(*dense, spec, 1), Catch::Contains("lora.experts: this model has no routed experts"));
  auto moe = model::make_model(test::tiny_v3(), 3);
  spec.targets = {"q_b_proj"};
  CHECK_THROWS_WITH(model::attach_lora(*moe, spec, 1), Catch::Contains("lora.targets [q_b_proj] name none of the routed experts'"));
  spec.targets = {"all-linear"}, spec.rank_pattern = {{"down_proj", 8}};
  auto other = model::make_model(test::tiny_v3(), 3);
  CHECK_THROWS_WITH(model::attach_lora(*other, spec, 1),
                    Catch::Contains("lora.rank_pattern: 'down_proj' matches the routed expert model.layers.1.mlp.experts.0.down_proj"));
}

TEST_CASE(
    "LoRA on the routed experts under the ZeRO engine: ZeRO 0 and 3, expert parallelism 2, as one process; the base stays "
    "bitwise",
    "[zero]") {
  test::EngineSpec one;
  one.expert_parallel = 1, one.lora_rank = 4, one.lora_experts = true, one.steps = 5;
  const test::EngineRun reference = test::run_engine(one);
  REQUIRE(reference.losses.size() == 5);
  for (const auto& [stage, ep] : {std::pair{0, 2}, std::pair{3, 1}, std::pair{3, 2}}) {
    DYNAMIC_SECTION("ZeRO-" << stage << ", expert parallelism " << ep << ", 2 ranks") {
      test::EngineSpec two = one;
      two.world = 2, two.stage = stage, two.expert_parallel = ep;
      const test::EngineRun run = test::run_engine(two);
      CHECK(test::worst_relative(run.losses, reference.losses) <= 1e-5);
      CHECK(test::worst_relative(run.grad_norms, reference.grad_norms) <= 1e-5);
      // Every expert's state gathered under its global name: the whole model, in the one process's
      // order; its base as the one process started (rank 0 alone holds only its experts).
      REQUIRE(run.names == reference.names);
      int64_t offset = 0, routed_b = 0;
      for (size_t i = 0; i < run.names.size(); ++i) {
        const at::Tensor now = run.master.narrow(0, offset, run.numels[i]), then = reference.initial.narrow(0, offset, run.numels[i]);
        INFO(run.names[i]);
        if (run.names[i].find(".lora_") == std::string::npos) CHECK(at::equal(now, then));
        if (run.names[i].find(".mlp.experts.") != std::string::npos && run.names[i].find(".lora_B.") != std::string::npos) ++routed_b;
        offset += run.numels[i];
      }
      CHECK(routed_b > 0);
    }
  }
}

TEST_CASE("LoRA: modules to save train in full; a name matches a module or a dotted suffix of one", "[model]") {
  const model::LoraSpec spec = spec_of(4, 8.0, {"q_proj"}, false, {"lm_head", "norm"});
  CHECK(model::lora_saves(spec, "lm_head.weight"));
  CHECK(model::lora_saves(spec, "model.norm.weight"));
  CHECK_FALSE(model::lora_saves(spec, "model.layers.0.input_layernorm.weight"));  // a suffix of the name, not of a module
  CHECK_FALSE(model::lora_saves(spec, "model.embed_tokens.weight"));
  auto m = model::make_model(test::tiny_model_config(), 3);
  model::attach_lora(*m, spec, 1);
  for (size_t i = 0; i < m->parameters().size(); ++i) {
    const std::string& name = m->parameters()[i].name;
    const bool trains = name.find(".lora_") != std::string::npos || name == "lm_head.weight" || name == "model.norm.weight";
    CHECK(m->parameter_places()[i].trains == trains);
  }
  auto other = model::make_model(test::tiny_model_config(), 3);
  CHECK_THROWS_WITH(model::attach_lora(*other, spec_of(4, 8.0, {"q_proj"}, false, {"lm_hed"}), 1),
                    Catch::Contains("lora.modules_to_save: 'lm_hed' is no module of this model"));
}

TEST_CASE("LoRA: the recipe's counts (nothing allocated) are the attached model's, by layer group", "[model]") {
  for (const bool moe : {false, true}) {
    DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense")) {
      config::Recipe r;
      r.model = moe ? test::tiny_v3() : test::tiny_model_config();
      r.lora.rank = 3, r.lora.modules_to_save = {"embed_tokens"};
      const config::FrozenCounts counts = model::lora_counts(r);
      auto m = model::make_model(r.model, 3);
      model::attach_lora(*m, model::lora_spec_of(r.lora), 1);
      std::vector<double> adapters(counts.adapters.size(), 0.0), frozen(counts.dense.size(), 0.0), routed(frozen);
      for (size_t i = 0; i < m->parameters().size(); ++i) {
        const model::ParamPlace& place = m->parameter_places()[i];
        const auto n = static_cast<double>(m->parameters()[i].tensor.numel());
        if (place.role == model::ParamRole::kAdapter)
          adapters[static_cast<size_t>(place.group)] += n;
        else if (!place.trains)
          (place.expert >= 0 ? routed : frozen)[static_cast<size_t>(place.group)] += n;
      }
      CHECK(counts.adapters == adapters);
      CHECK(counts.routed_adapters == std::vector<double>(adapters.size(), 0.0));
      CHECK(counts.dense == frozen);
      CHECK(counts.routed == routed);
      CHECK(counts.dense.front() == 0);  // the embedding trains in full
      const int last = static_cast<int>(r.model.num_layers) + 1;
      CHECK(counts.adapters_in(0, last) > 0);
      CHECK(counts.adapters_in(0, 0) == 0);  // no adapter on the embedding
    }
  }
}

TEST_CASE("DoRA: fresh, the logits are the base's bitwise; the forward and gradients equal the merged model's (float64)", "[model]") {
  for (const bool moe : {false, true}) {
    DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense")) {
      const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
      model::LoraSpec spec = spec_of(4, 16.0, {"q_proj", "q_b_proj", "kv_b_proj", "o_proj", "down_proj"});
      spec.dora = true;
      const double scale = model::lora_scale(spec);
      auto base = model::make_model(cfg, 3, at::kDouble), adapted = model::make_model(cfg, 3, at::kDouble),
           merged = model::make_model(cfg, 3, at::kDouble);
      REQUIRE(model::attach_lora(*adapted, spec, 11) > 0);
      const at::Tensor tokens = tokens_of(cfg.vocab_size);
      CHECK(at::equal(adapted->logits(tokens), base->logits(tokens)));  // m = |W|: every row's ratio is exactly 1
      std::map<std::string, at::Tensor> params = by_name(*adapted), reference = by_name(*merged);
      std::map<std::string, at::Tensor> norms, ratios;  // per projection: |W + s BA| and m / it, constants of the merge
      at::Generator g = at::detail::createCPUGenerator(21);
      {
        c10::NoGradGuard no_grad;
        for (model::Linear* l : adapted->linears()) {
          if (l->adapters.empty()) continue;
          at::Tensor b = params.at(l->module + ".lora_B.weight"), m = params.at(l->module + ".lora_magnitude_vector");
          CHECK(at::equal(m, at::linalg_vector_norm(l->weight, 2, at::IntArrayRef{1})));  // PEFT's initial magnitude
          b.copy_(at::randn(b.sizes(), g, at::kDouble) * 0.1);
          m.mul_(1 + 0.1 * at::randn(m.sizes(), g, at::kDouble));
          const at::Tensor v = l->weight + at::mm(b, params.at(l->module + ".lora_A.weight")) * scale;
          norms[l->module] = at::linalg_vector_norm(v, 2, at::IntArrayRef{1});
          ratios[l->module] = m / norms[l->module];
          reference.at(l->module + ".weight").copy_(v * ratios[l->module].unsqueeze(1));
        }
      }
      backward_both(*adapted, *merged, reference, tokens);
      for (model::Linear* l : adapted->linears()) {
        if (l->adapters.empty()) continue;
        INFO(l->module);
        // W' = diag(m / n) (W + s BA) with n held constant (detached): dL/d(BA) = s diag(m / n) G.
        const at::Tensor grad = reference.at(l->module + ".weight").grad() * ratios.at(l->module).unsqueeze(1);
        const at::Tensor a = params.at(l->module + ".lora_A.weight"), b = params.at(l->module + ".lora_B.weight");
        const at::Tensor m = params.at(l->module + ".lora_magnitude_vector");
        CHECK(at::allclose(b.grad(), at::mm(grad, a.t()) * scale, 1e-9, 1e-12));
        CHECK(at::allclose(a.grad(), at::mm(b.t(), grad) * scale, 1e-9, 1e-12));
        const at::Tensor v = l->weight + at::mm(b, a).detach() * scale;
        CHECK(at::allclose(m.grad(), (reference.at(l->module + ".weight").grad() * v).sum(1) / norms.at(l->module), 1e-9, 1e-12));
        CHECK_FALSE(l->weight.grad().defined());
      }
    }
  }
}

TEST_CASE("DoRA: a zero row of the base stays finite (PEFT divides by its zero norm)", "[model]") {
  auto m = model::make_model(test::tiny_model_config(), 3, at::kDouble);
  {
    c10::NoGradGuard no_grad;
    m->linear("model.layers.0.self_attn.o_proj")->weight[0].zero_();
  }
  model::LoraSpec spec = spec_of(4, 8.0, {"o_proj"});
  spec.dora = true;
  model::attach_lora(*m, spec, 2);
  const at::Tensor tokens = tokens_of(test::tiny_model_config().vocab_size);
  const at::Tensor loss = model::mean_loss(*m, tokens, at::roll(tokens, -1, 1));
  loss.backward();
  CHECK(std::isfinite(loss.item<double>()));
  for (const auto& p : m->parameters())
    if (p.tensor.grad().defined()) CHECK(at::isfinite(p.tensor.grad()).all().item<bool>());
}

TEST_CASE("lora.dropout: torch's Dropout on the adapter's input, each row's mask keyed by its place in the data", "[model]") {
  const at::Tensor x = at::ones({4, 8, 64}, at::kDouble);
  CHECK(model::lora_dropout(x, 0.25, 7).is_same(x));  // no training rows: evaluation
  at::Tensor y;
  {
    const model::TrainingRowsScope rows({10, 4});
    y = model::lora_dropout(x, 0.25, 7);
    CHECK(at::equal(model::lora_dropout(x, 0.25, 7), y));                                      // the same rows: the same mask
    CHECK(at::equal(model::lora_dropout(x.reshape({32, 64}), 0.25, 7), y.reshape({32, 64})));  // tokens flattened: rows still rows
    CHECK_FALSE(at::equal(model::lora_dropout(x, 0.25, 8), y));                                // another projection's stream
  }
  const at::Tensor kept = y.ne(0);
  CHECK(at::equal(y.masked_select(kept), at::full({kept.sum().item<int64_t>()}, 1.0 / 0.75, at::kDouble)));
  CHECK(kept.to(at::kDouble).mean().item<double>() == Approx(0.75).margin(0.03));  // 2048 elements: 3 standard deviations
  {
    const model::TrainingRowsScope later({12, 2});  // rows 12 and 13 in another micro-batch
    CHECK(at::equal(model::lora_dropout(x.narrow(0, 2, 2), 0.25, 7), y.narrow(0, 2, 2)));
  }
  CHECK(model::current_training_rows().first == -1);  // the scopes restored what was there
}

TEST_CASE("lora.dropout in the model: evaluation is undropped; a row trains alike in any micro-batch, recomputed or not", "[model]") {
  for (const bool dora : {false, true}) {
    DYNAMIC_SECTION((dora ? "DoRA" : "LoRA")) {
      const config::ModelConfig cfg = test::tiny_model_config();
      model::LoraSpec spec = spec_of(4, 16.0), plain = spec;
      spec.dora = plain.dora = dora, spec.dropout = 0.3;
      auto dropped = model::make_model(cfg, 3, at::kDouble), reference = model::make_model(cfg, 3, at::kDouble);
      model::attach_lora(*dropped, spec, 11), model::attach_lora(*reference, plain, 11);
      {
        c10::NoGradGuard no_grad;
        at::Generator g = at::detail::createCPUGenerator(21);
        for (auto* m : {dropped.get(), reference.get()}) {
          at::Generator same = g.clone();
          for (const auto& p : m->parameters())
            if (p.name.find("lora_B") != std::string::npos) p.tensor.copy_(at::randn(p.tensor.sizes(), same, at::kDouble) * 0.1);
        }
      }
      const at::Tensor tokens = tokens_of(cfg.vocab_size);
      CHECK(at::equal(dropped->logits(tokens), reference->logits(tokens)));  // evaluation: nothing dropped
      model::CausalLM::Input whole{tokens, {}, {}};
      whole.first_row = 6;
      const at::Tensor hidden = dropped->hidden_states(whole).hidden;
      CHECK_FALSE(at::allclose(hidden, reference->hidden_states(whole).hidden));
      model::CausalLM::Input second{tokens.narrow(0, 1, 1), {}, {}};  // row 7 alone, as another micro-batch holds it
      second.first_row = 7;
      CHECK(at::allclose(dropped->hidden_states(second).hidden, hidden.narrow(0, 1, 1), 1e-12, 1e-12));
      // Recomputation in backward draws the forward's masks: the same gradients.
      std::vector<at::Tensor> grads[2];
      for (const auto mode : {config::Recompute::kNone, config::Recompute::kFull}) {
        dropped->set_activation_checkpointing(mode);
        for (const auto& p : dropped->parameters())
          if (p.tensor.grad().defined()) p.tensor.mutable_grad() = at::Tensor();
        dropped->hidden_states(whole).hidden.pow(2).sum().backward();
        for (const auto& p : dropped->parameters())
          if (p.tensor.grad().defined()) grads[mode == config::Recompute::kFull].push_back(p.tensor.grad().clone());
      }
      REQUIRE(grads[0].size() == grads[1].size());
      for (size_t i = 0; i < grads[0].size(); ++i) CHECK(at::allclose(grads[0][i], grads[1][i], 1e-12, 1e-14));
    }
  }
}

TEST_CASE("LoRA: with the adapters off (AdaptersOff) the logits are the base's bitwise, routed experts' and DoRA's too", "[model]") {
  for (const bool moe : {false, true}) {
    for (const bool dora : {false, true}) {
      DYNAMIC_SECTION((moe ? "MLA + MoE, experts adapted" : "dense") << (dora ? ", DoRA" : "")) {
        const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
        auto base = model::make_model(cfg, 3), adapted = model::make_model(cfg, 3);
        model::LoraSpec spec = spec_of(4, 8.0);
        spec.experts = moe, spec.dora = dora;
        REQUIRE(model::attach_lora(*adapted, spec, 11) > 0);
        {
          c10::NoGradGuard no_grad;
          at::Generator g = at::detail::createCPUGenerator(21);
          for (const auto& p : adapted->parameters())
            if (p.name.find("lora_B") != std::string::npos) p.tensor.copy_(at::randn(p.tensor.sizes(), g, at::kFloat) * 0.1);
        }
        const at::Tensor tokens = tokens_of(cfg.vocab_size);
        const at::Tensor on = adapted->logits(tokens);
        CHECK_FALSE(at::equal(on, base->logits(tokens)));
        {
          model::AdaptersOff off;
          CHECK_FALSE(model::adapters_on());
          CHECK(at::equal(adapted->logits(tokens), base->logits(tokens)));
        }
        CHECK(model::adapters_on());
        CHECK(at::equal(adapted->logits(tokens), on));
      }
    }
  }
}
