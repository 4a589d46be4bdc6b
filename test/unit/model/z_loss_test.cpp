// PaLM's z-loss (model/z_loss.h) against the formula on the whole logits, with plain ATen ops:
// the objective's loss and every gradient, plain and chunked heads, per-target weights, the
// metric's sum and count. (test/model/mtp_reference.py checks the MLA + MoE model with MTP
// against an independent PyTorch model.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "catch_torch.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/z_loss.h"
#include "engine_harness.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

data::Batch masked_batch(int64_t vocab) {
  at::Generator g = at::detail::createCPUGenerator(11);
  const at::Tensor tokens = at::randint(0, vocab, {3, 16}, g, at::kLong);
  at::Tensor labels = at::randint(0, vocab, {3, 16}, g, at::kLong);
  labels.masked_fill_(at::rand({3, 16}, g).lt(0.3), data::kIgnoreIndex);
  return data::labelled_batch(tokens, labels);
}

std::vector<at::Tensor> grads_of(const model::CausalLM& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::zeros_like(p.tensor));
  return out;
}

// The reference: cross-entropy mean + aux + weight x mean over trained targets of logsumexp(logits)^2.
at::Tensor reference_loss(const model::CausalLM& m, const data::Batch& b, double weight) {
  const model::CausalLM::Hidden h = m.hidden_states(model::input_of(b));
  const at::Tensor logits = at::linear(h.hidden, h.head).reshape({b.labels.numel(), -1});
  const at::Tensor flat = b.labels.reshape({-1});
  const at::Tensor trained = flat.ne(data::kIgnoreIndex);
  const at::Tensor n = trained.sum().to(at::kDouble);
  const at::Tensor ce = at::cross_entropy_loss(logits, flat, {}, at::Reduction::Sum, data::kIgnoreIndex);
  const at::Tensor z = (at::logsumexp(logits, -1).square() * trained).sum();
  const at::Tensor loss = m.close(h, ce + weight * z) / n;
  return h.aux.defined() ? loss + h.aux : loss;
}

}  // namespace

TEST_CASE("z-loss: the objective's loss and every gradient equal the formula on the whole logits (dense and MLA + MoE)", "[model]") {
  const double weight = 0.02;
  for (const bool moe : {false, true})
    for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
      for (const int64_t chunk : {int64_t{0}, int64_t{7}}) {
        // fp32: 1e-6 of each gradient's largest element (2e-6 for the routed experts' few-token
        // sums, added in another order); float64: the same formula to rounding.
        const double tolerance = dtype == at::kDouble ? 1e-10 : moe ? 2e-6 : 1e-6;
        DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense") << ", " << c10::toString(dtype) << ", chunk " << chunk) {
          const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
          const data::Batch b = masked_batch(cfg.vocab_size);
          auto ours = model::make_model(cfg, 5, dtype), theirs = model::make_model(cfg, 5, dtype);
          model::Objective objective(chunk);
          model::add_z_loss_term(objective, weight);
          REQUIRE(objective.metrics().size() == 1);
          CHECK(objective.metrics()[0].name == "z_loss");
          const model::ObjectiveValue v = objective(*ours, b);
          const at::Tensor want = reference_loss(*theirs, b, weight);
          CHECK(v.mean().item<double>() == Approx(want.item<double>()).epsilon(tolerance));
          v.mean().backward();
          want.backward();
          const std::vector<at::Tensor> got = grads_of(*ours), expected = grads_of(*theirs);
          for (size_t i = 0; i < got.size(); ++i) {
            const double scale = std::max(expected[i].abs().max().item<double>(), 1e-12);
            INFO(ours->parameters()[i].name);
            CHECK((got[i] - expected[i]).abs().max().item<double>() / scale <= tolerance);
          }
          // The metric: the mean logsumexp^2 over trained targets, before the weight.
          const at::Tensor logits = ours->logits(b.tokens).reshape({b.labels.numel(), -1});
          const at::Tensor trained = b.labels.reshape({-1}).ne(data::kIgnoreIndex);
          const double mean_lse2 = ((at::logsumexp(logits, -1).square() * trained).sum() / trained.sum()).item<double>();
          CHECK(v.terms[0][1].item<double>() == static_cast<double>(b.trained_targets));
          CHECK(v.terms[0][0].item<double>() / v.terms[0][1].item<double>() == Approx(mean_lse2).epsilon(1e-6));
        }
      }
}

TEST_CASE("z-loss: chunked equals whole, with per-target weights and without; no term at weight 0", "[model]") {
  at::Generator g = at::detail::createCPUGenerator(3);
  const at::Tensor hidden = at::randn({2, 9, 8}, g), head = at::randn({13, 8}, g) * 0.5;
  at::Tensor labels = at::randint(0, 13, {2, 9}, g, at::kLong);
  labels[0][3] = data::kIgnoreIndex;
  const at::Tensor weights = at::rand({2, 9}, g);
  // The value and the gradients for hidden and head, on fresh leaves.
  auto run = [&](const at::Tensor& w, int64_t chunk, std::vector<at::Tensor>& grads) {
    const at::Tensor h = hidden.clone().requires_grad_(true), v = head.clone().requires_grad_(true);
    const at::Tensor z = model::summed_z_loss(h, v, labels, w, chunk);
    z.backward();
    grads = {h.grad(), v.grad()};
    return z.item<double>();
  };
  for (const bool weighted : {false, true}) {
    const at::Tensor w = weighted ? weights : at::Tensor();
    std::vector<at::Tensor> gw, gp;
    const double whole = run(w, 0, gw);
    for (const int64_t chunk : {1, 4, 18, 100}) {
      CHECK(run(w, chunk, gp) == Approx(whole).epsilon(1e-6));
      CHECK(at::allclose(gp[0], gw[0], 1e-5, 1e-6));
      CHECK(at::allclose(gp[1], gw[1], 1e-5, 1e-6));
    }
  }
  model::Objective none;
  model::add_z_loss_term(none, 0.0);
  CHECK(none.num_terms() == 0);
}
