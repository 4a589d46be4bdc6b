#include "catch_torch.h"

#include <ATen/ATen.h>

#include <cmath>

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/dense_model.h"

using namespace dstrain;

namespace {
config::ModelConfig tiny() {
  config::ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.intermediate_size = 64;
  c.max_seq_len = 16;
  return c;
}
}  // namespace

TEST_CASE("parameters have HF names, shapes and the expected count", "[model]") {
  const model::DenseModel m(tiny(), 1);
  const auto& p = m.parameters();
  REQUIRE(p.size() == 1 + 2 * 9 + 2);
  CHECK(p.front().name == "model.embed_tokens.weight");
  CHECK(p[2].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(p[7].name == "model.layers.0.mlp.gate_proj.weight");
  CHECK(p[9].tensor.sizes() == at::IntArrayRef({32, 64}));  // down_proj [H, I]
  CHECK(p.back().name == "lm_head.weight");
  // 2VH + L(4H^2 + 3HI + 2H) + H, and the config-only count agrees with the real one
  CHECK(m.num_parameters() == 2 * 256 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32);
  CHECK(m.num_parameters() == cost::parameter_counts(tiny()).total);
  config::ModelConfig gqa = tiny();
  gqa.num_kv_heads = 2;
  const model::DenseModel g(gqa, 1);
  CHECK(g.parameters()[3].tensor.sizes() == at::IntArrayRef({16, 32}));  // k_proj [n_kv * d, H]
  CHECK(g.num_parameters() == cost::parameter_counts(gqa).total);
}

TEST_CASE("the same seed builds the same weights", "[model]") {
  const model::DenseModel a(tiny(), 5), b(tiny(), 5), c(tiny(), 6);
  for (size_t i = 0; i < a.parameters().size(); ++i) CHECK(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor));
  CHECK_FALSE(at::equal(a.parameters()[1 + 1].tensor, c.parameters()[1 + 1].tensor));
}

TEST_CASE("loss starts near ln(vocab) and gives gradients to every parameter", "[model]") {
  const model::DenseModel m(tiny(), 3);
  const at::Tensor tokens = at::randint(0, 256, {2, 17}, at::kLong);
  const at::Tensor inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  const at::Tensor loss = model::mean_loss(m, inputs, targets);
  CHECK(loss.item<double>() == Approx(std::log(256.0)).margin(0.3));
  loss.backward();
  for (const auto& p : m.parameters()) {
    INFO(p.name);
    REQUIRE(p.tensor.grad().defined());
    CHECK(p.tensor.grad().abs().sum().item<double>() > 0);
  }
}
