// Activation checkpointing (model/recompute.h): full and selective recompute give the loss and
// every parameter's gradient of no recompute bit for bit in fp32, for the dense model and the
// MLA + MoE model (with its balance loss and document masks); the expert load counts once; a
// region runs again in backward exactly once; no graph without grad mode.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/recompute.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

config::ModelConfig tiny_dense() {
  config::ModelConfig c;
  c.vocab_size = 97, c.hidden_size = 32, c.num_layers = 3, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 48;
  c.max_seq_len = 16;
  return c;
}

struct Result {
  at::Tensor loss, load;
  std::vector<at::Tensor> grads;
};

Result train_once(const config::ModelConfig& c, config::Recompute mode, bool document_mask) {
  const auto m = model::make_model(c, 17);
  m->set_activation_checkpointing(mode);
  const model::Objective loss_of(7);
  at::manual_seed(2);
  const at::Tensor tokens = at::randint(0, c.vocab_size, {3, 17}, at::kLong);
  const data::Batch batch = data::pretraining_batch(tokens, document_mask ? 5 : -1, document_mask);
  Result r;
  for (int step = 0; step < 2; ++step) {  // twice: gradients accumulate as over micro-batches
    const at::Tensor loss = loss_of(*m, batch).mean();
    loss.backward();
    r.loss = loss.detach();
  }
  for (const auto& p : m->parameters()) r.grads.push_back(p.tensor.grad());
  r.load = m->take_expert_load();
  return r;
}

void check_identical(const config::ModelConfig& c, bool document_mask) {
  const Result want = train_once(c, config::Recompute::kNone, document_mask);
  for (const auto mode : {config::Recompute::kFull, config::Recompute::kSelective}) {
    INFO("mode " << config::name(mode));
    const Result got = train_once(c, mode, document_mask);
    CHECK(at::equal(got.loss, want.loss));
    REQUIRE(got.grads.size() == want.grads.size());
    for (size_t i = 0; i < want.grads.size(); ++i) {
      INFO("parameter " << i);
      REQUIRE(got.grads[i].defined() == want.grads[i].defined());
      if (want.grads[i].defined()) CHECK(at::equal(got.grads[i], want.grads[i]));
    }
    CHECK(got.load.defined() == want.load.defined());
    if (want.load.defined()) CHECK(at::equal(got.load, want.load));  // counted in forward only
  }
}

}  // namespace

TEST_CASE("recompute: full and selective give no-recompute's loss and gradients bit for bit (dense)", "[model]") {
  check_identical(tiny_dense(), false);
  check_identical(tiny_dense(), true);
}

TEST_CASE("recompute: full and selective give no-recompute's loss and gradients bit for bit (MLA + MoE)", "[model]") {
  check_identical(test::tiny_v3(), false);
  check_identical(test::tiny_v3(), true);
}

TEST_CASE("recompute: a region keeps only its inputs and runs once more in backward", "[model]") {
  int runs = 0, again_runs = 0;
  const at::Tensor w = at::randn({8, 8}, at::kDouble).set_requires_grad(true);
  const model::Region region = [&](const std::vector<at::Tensor>& in, bool again) {
    ++runs;
    again_runs += again ? 1 : 0;
    return std::vector<at::Tensor>{at::tanh(at::matmul(in[0], w)), in[1] * 2};
  };
  const at::Tensor x = at::randn({4, 8}, at::kDouble).set_requires_grad(true), y = at::randn({3}, at::kDouble).set_requires_grad(true);
  const std::vector<at::Tensor> out = model::recompute(region, {x, y});
  CHECK(runs == 1);
  CHECK_FALSE(out[0].grad_fn() == nullptr);
  (out[0].sum() + out[1].sum() * 3).backward();
  CHECK(runs == 2);
  CHECK(again_runs == 1);
  const at::Tensor xr = x.detach().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  at::tanh(at::matmul(xr, wr)).sum().backward();
  CHECK(at::allclose(x.grad(), xr.grad(), 0, 1e-15));
  CHECK(at::allclose(w.grad(), wr.grad(), 0, 1e-15));
  CHECK(at::allclose(y.grad(), at::full({3}, 6.0, at::kDouble)));
  // Without grad mode the region runs once and builds no graph.
  const c10::NoGradGuard no_grad;
  CHECK_FALSE(model::recompute(region, {x, y})[0].requires_grad());
  CHECK(runs == 3);
}
