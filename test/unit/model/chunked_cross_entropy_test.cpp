// The fused, chunked LM head + cross-entropy against at::cross_entropy_loss over the full
// logits: the loss and both gradients, in double (exact up to rounding), through a whole model
// in fp32, and in bf16 within bf16's rounding; ignored targets; no graph without grad mode.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dstrain/data/batch.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/chunked_cross_entropy.h"

using namespace dstrain;

namespace {

struct Grads {
  at::Tensor loss, hidden, weight;
};

Grads run(const at::Tensor& hidden0, const at::Tensor& weight0, const at::Tensor& targets, int64_t chunk, bool head_trains = true) {
  const at::Tensor hidden = hidden0.detach().clone().set_requires_grad(true);
  const at::Tensor weight = weight0.detach().clone().set_requires_grad(head_trains);
  at::Tensor loss;
  if (chunk > 0) {
    loss = model::chunked_linear_cross_entropy(hidden, weight, targets, chunk, model::kIgnoreIndex);
  } else {
    const at::Tensor logits = at::linear(hidden, weight);
    loss = at::cross_entropy_loss(logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat), targets, {}, at::Reduction::Sum,
                                  model::kIgnoreIndex);
  }
  (loss * 0.75).backward();  // a non-unit incoming gradient
  return {loss.detach(), hidden.grad(), weight.grad()};
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.to(at::kDouble).abs().max().item<double>();
}

}  // namespace

TEST_CASE("chunked linear cross-entropy: loss and gradients of the full-logit path, any chunk size", "[model]") {
  at::manual_seed(3);
  const int64_t N = 37, H = 8, V = 23;
  const at::Tensor hidden = at::randn({N, H}, at::kDouble), weight = at::randn({V, H}, at::kDouble);
  at::Tensor targets = at::randint(0, V, {N}, at::kLong);
  targets.narrow(0, 4, 3).fill_(model::kIgnoreIndex);
  const Grads want = run(hidden, weight, targets, 0);
  for (const int64_t chunk : {1, 5, 36, 37, 100}) {
    INFO("chunk " << chunk);
    const Grads got = run(hidden, weight, targets, chunk);
    CHECK(got.loss.item<double>() == Approx(want.loss.item<double>()).epsilon(1e-13));
    CHECK(rel(got.hidden, want.hidden) < 1e-13);
    CHECK(rel(got.weight, want.weight) < 1e-13);
    CHECK((got.hidden.narrow(0, 4, 3) == 0).all().item<bool>());                      // ignored rows get no gradient
    const Grads frozen = run(hidden, weight, targets, chunk, /*head_trains=*/false);  // a frozen head (LoRA): no weight GEMM
    CHECK_FALSE(frozen.weight.defined());
    CHECK(at::equal(frozen.hidden, got.hidden));
    CHECK(at::equal(frozen.loss, got.loss));
  }
  // bf16: the same within bf16 rounding (the softmax and the sums in fp32 in both paths).
  const Grads want16 = run(hidden.to(at::kBFloat16), weight.to(at::kBFloat16), targets, 0);
  const Grads got16 = run(hidden.to(at::kBFloat16), weight.to(at::kBFloat16), targets, 8);
  CHECK(got16.loss.scalar_type() == at::kFloat);
  CHECK(got16.loss.item<double>() == Approx(want16.loss.item<double>()).epsilon(1e-5));
  CHECK(got16.weight.scalar_type() == at::kBFloat16);
  CHECK(rel(got16.hidden, want16.hidden) < 1e-2);
  CHECK(rel(got16.weight, want16.weight) < 1e-2);
}

TEST_CASE("chunked linear cross-entropy: a whole model's loss and gradients match the full logits", "[model]") {
  config::ModelConfig c;
  c.vocab_size = 97, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4, c.intermediate_size = 64, c.max_seq_len = 16;
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, c.vocab_size, {3, 17}, at::kLong);
  const data::Batch batch = data::pretraining_batch(tokens);
  auto losses = [&](int64_t chunk) {
    const auto m = model::make_model(c, 11);
    const model::ObjectiveValue parts = model::Objective(chunk)(*m, batch);
    parts.mean().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : m->parameters()) grads.push_back(p.tensor.grad());
    return std::make_pair(parts.sum.item<double>(), grads);
  };
  const auto [want_loss, want_grads] = losses(0);
  const auto [got_loss, got_grads] = losses(10);  // 48 tokens in 5 chunks
  CHECK(got_loss == Approx(want_loss).epsilon(1e-6));
  for (size_t i = 0; i < want_grads.size(); ++i) CHECK(rel(got_grads[i], want_grads[i]) < 1e-5);
  // Without grad mode: the loss alone, no graph.
  const auto m = model::make_model(c, 11);
  const c10::NoGradGuard no_grad;
  const at::Tensor loss = model::Objective(10)(*m, batch).sum;
  CHECK_FALSE(loss.requires_grad());
  CHECK(loss.item<double>() == Approx(want_loss).epsilon(1e-6));
}
