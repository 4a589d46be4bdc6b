#include "catch_torch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dstrain/model/causal_lm.h"
#include "dstrain/model/linear.h"
#include "dstrain/model/loss.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

config::ModelConfig tiny_dense() {
  config::ModelConfig c;
  c.vocab_size = 97, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 64;
  c.max_seq_len = 16;
  return c;
}

// A rank-1 update B·A on one Linear, written here alone: out + x Aᵀ Bᵀ, B from zero (the model
// starts as it was), both trained while the base stays frozen. It reaches the model through the
// Linear's attachment point only: no family knows of it.
struct RankOneAdapter final : model::LinearAdapter {
  at::Tensor a, b;  // [1, in], [out, 1]
  RankOneAdapter(int64_t in, int64_t out) {
    at::Generator gen = at::detail::createCPUGenerator(5);
    a = at::normal(0.0, 0.5, {1, in}, gen).set_requires_grad(true);
    b = at::zeros({out, 1}).set_requires_grad(true);
  }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& output) const override { return output + at::linear(at::linear(x, a), b); }
};

at::Tensor tokens_of(int64_t vocab, int64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return at::randint(vocab, {2, 12}, gen, at::kLong);
}

// Trains only the adapter for `steps` SGD steps on a fixed batch; returns the losses.
std::vector<double> train_adapter(model::CausalLM& m, const RankOneAdapter& adapter, int64_t vocab, int steps) {
  const at::Tensor tokens = tokens_of(vocab, 3);
  const at::Tensor inputs = tokens.narrow(1, 0, 11), labels = tokens.narrow(1, 1, 11);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const at::Tensor loss = model::mean_loss(m, inputs, labels);
    losses.push_back(loss.item<double>());
    loss.backward();
    c10::NoGradGuard no_grad;
    for (const at::Tensor& p : {adapter.a, adapter.b}) {
      p.sub_(p.grad(), 4.0);
      p.mutable_grad().zero_();
    }
  }
  return losses;
}

void adapter_trains_while_base_stays(const config::ModelConfig& cfg, const std::string& module) {
  auto m = model::make_model(cfg, 11);
  model::Linear* target = m->linear(module);
  REQUIRE(target != nullptr);
  CHECK(target->weight.is_same(m->parameters()[target->index].tensor));
  std::map<std::string, at::Tensor> before;
  for (const auto& p : m->parameters()) {
    before[p.name] = p.tensor.detach().clone();
    p.tensor.requires_grad_(false);  // the base is frozen
  }
  const at::Tensor probe = tokens_of(cfg.vocab_size, 4);
  const at::Tensor plain = m->logits(probe);
  auto adapter = std::make_shared<RankOneAdapter>(target->in_features(), target->out_features());
  target->adapters.push_back(adapter);
  CHECK(at::equal(m->logits(probe), plain));  // B = 0: the same model, to the bit
  const std::vector<double> losses = train_adapter(*m, *adapter, cfg.vocab_size, 20);
  INFO(module << ": " << losses.front() << " -> " << losses.back());
  CHECK(losses.back() < losses.front() - 0.05);
  CHECK(adapter->b.abs().sum().item<double>() > 0);
  for (const auto& p : m->parameters()) {
    INFO(p.name);
    CHECK(at::equal(p.tensor, before.at(p.name)));
  }
  CHECK_FALSE(at::equal(m->logits(probe), plain));
  target->adapters.clear();
  CHECK(at::equal(m->logits(probe), plain));
}

}  // namespace

TEST_CASE("model parts: a test-only adapter on one Linear trains while the base stays bitwise unchanged", "[model][parts]") {
  adapter_trains_while_base_stays(tiny_dense(), "model.layers.1.self_attn.v_proj");
  adapter_trains_while_base_stays(test::tiny_v3(), "model.layers.0.self_attn.kv_b_proj");
  adapter_trains_while_base_stays(test::tiny_v3(), "model.layers.2.mlp.shared_experts.up_proj");
}

TEST_CASE("model parts: every projection is a Linear with its role, and roles give decay and FP8", "[model][parts]") {
  config::ModelConfig v3 = test::tiny_v3();
  v3.mtp_depth = 1;
  for (const config::ModelConfig& cfg : {tiny_dense(), v3}) {
    auto m = model::make_model(cfg, 1);
    const auto& params = m->parameters();
    const auto& places = m->parameter_places();
    std::set<size_t> linear_params;
    for (const model::Linear* l : m->linears()) {
      INFO(l->module);
      CHECK(params[l->index].name == l->module + ".weight");
      CHECK(places[l->index].role == l->role);
      CHECK(l->weight.dim() == 2);
      linear_params.insert(l->index);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      const model::ParamRole role = places[i].role;
      INFO(name << " as " << model::role_name(role));
      const bool is_projection = name.find("_proj") != std::string::npos;
      const bool routed = name.find(".experts.") != std::string::npos;
      // Every projection but the routed experts' (a grouped linear) is a Linear, as is the router.
      CHECK((linear_params.count(i) > 0) == ((is_projection && !routed) || name.find("mlp.gate.weight") != std::string::npos));
      CHECK(places[i].trains);
      CHECK(places[i].decays() == (params[i].tensor.dim() >= 2));  // what the shape said before roles
      if (name.find("norm") != std::string::npos) CHECK(role == model::ParamRole::kNorm);
      if (routed) CHECK((role == model::ParamRole::kExpert && places[i].expert >= 0));
      if (name == "model.embed_tokens.weight") CHECK(role == model::ParamRole::kEmbedding);
      if (name == "lm_head.weight") CHECK(role == model::ParamRole::kHead);
      CHECK(model::stored_as_fp8(role) == (is_projection && name.find("eh_proj") == std::string::npos));
    }
    CHECK(m->linear("model.layers.0.no_such_proj") == nullptr);
  }
}

TEST_CASE("model parts: the attention scope builds the document mask the loss used to", "[model][parts]") {
  for (const config::ModelConfig& cfg : {tiny_dense(), test::tiny_v3()}) {
    auto m = model::make_model(cfg, 2);
    const at::Tensor tokens = tokens_of(cfg.vocab_size, 6);
    const at::Tensor docs = at::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2}, at::kLong).view({2, 12});
    model::CausalLM::Input by_documents{tokens, {}, {}};
    by_documents.document_ids = docs;
    const at::Tensor by_ids = m->logits(by_documents);
    const at::Tensor by_mask = m->logits(model::CausalLM::Input{tokens, {}, model::document_causal_mask_of(docs)});
    CHECK(at::equal(by_ids, by_mask));
    CHECK_FALSE(at::equal(by_ids, m->logits(tokens)));
    // The scope's first n tokens are the mask's top-left block (MTP's shorter sequences).
    const model::AttentionScope scope = by_documents.scope().first(7);
    CHECK(at::equal(scope.mask, model::document_causal_mask_of(docs.narrow(1, 0, 7))));
  }
}
