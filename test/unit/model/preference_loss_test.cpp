// The DPO objective (model/preference_loss.h) against the formula on the whole logits with plain
// autograd: the loss and every parameter's gradient (its chunked log-probs and the gradient it
// takes through the loss-weighted chunked cross-entropy), plain and chunked, dense and MLA + MoE,
// several loss types at once; and its metrics. (dist.dpo checks the same against TRL's DPOTrainer.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "catch_torch.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "engine_harness.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

// 3 pairs of 12 tokens: prompts untrained, completions of different lengths, a row end padded.
data::Batch pair_batch(int64_t vocab) {
  at::Generator g = at::detail::createCPUGenerator(17);
  const at::Tensor tokens = at::randint(0, vocab, {6, 12}, g, at::kLong);
  at::Tensor labels = at::full({6, 12}, data::kIgnoreIndex, at::kLong);
  const int64_t prompt[] = {3, 3, 5, 5, 2, 2}, end[] = {11, 8, 9, 11, 6, 10};
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t t = prompt[r] - 1; t < end[r]; ++t) labels[r][t] = tokens[r][t + 1];
  data::Batch b = data::labelled_batch(tokens, labels);
  b.pairs = 3;
  b.reference_logps = at::randn({6}, g, at::kDouble) * 2 - 40;
  return b;
}

std::vector<at::Tensor> grads_of(const model::CausalLM& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::zeros_like(p.tensor));
  return out;
}

// sigmoid + 0.5 x ipo on the whole logits, summed over pairs (what the runner divides by the pairs).
at::Tensor reference_loss(const model::CausalLM& m, const data::Batch& b, double beta) {
  const model::CausalLM::Hidden h = m.hidden_states(model::input_of(b));
  const at::Tensor logp = at::log_softmax(at::linear(h.hidden, h.head).to(at::kFloat), -1);
  const at::Tensor mask = b.labels.ne(data::kIgnoreIndex);
  const at::Tensor rows = (logp.gather(-1, b.labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1);
  const at::Tensor ratio = (rows - b.reference_logps.to(at::kFloat)).view({-1, 2}), tokens = mask.sum(-1).to(at::kFloat).view({-1, 2});
  const at::Tensor delta = ratio.select(1, 0) - ratio.select(1, 1);
  const at::Tensor mean = ratio.select(1, 0) / tokens.select(1, 0) - ratio.select(1, 1) / tokens.select(1, 1);
  const at::Tensor loss = (-at::log_sigmoid(beta * delta)).sum() + 0.5 * (mean - 1 / (2 * beta)).pow(2).sum();
  return m.close(h, loss);
}

}  // namespace

TEST_CASE("dpo: the objective's loss and every gradient equal the formula on the whole logits (dense and MLA + MoE, chunked)", "[model]") {
  config::PreferenceConfig c;
  c.beta = 0.3, c.loss_type = {"sigmoid", "ipo"}, c.loss_weights = {1.0, 0.5};
  for (const bool moe : {false, true})
    for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
      DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense") << ", chunk " << chunk) {
        config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
        cfg.aux_loss_alpha = 0;  // the balance loss is the runner's to add, not the pair loss's
        const data::Batch b = pair_batch(cfg.vocab_size);
        auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
        model::Objective objective(chunk);
        model::set_preference_loss(objective, c);
        REQUIRE(objective.metrics().size() == model::preference_metric_names().size());
        const model::ObjectiveValue v = objective(*ours, b);
        CHECK(v.count == 3);
        const at::Tensor want = reference_loss(*theirs, b, c.beta);
        CHECK(v.sum.item<double>() == Approx(want.item<double>()).epsilon(1e-6));
        v.sum.backward();
        want.backward();
        const std::vector<at::Tensor> got = grads_of(*ours), expected = grads_of(*theirs);
        for (size_t i = 0; i < got.size(); ++i) {
          const double scale = std::max(expected[i].abs().max().item<double>(), 1e-12);
          INFO(ours->parameters()[i].name);
          CHECK((got[i] - expected[i]).abs().max().item<double>() / scale <= 2e-5);
        }
        // rewards/accuracies: strict, over the pairs; logps/chosen: the chosen sums' mean.
        const model::RowLogps rows = model::completion_logps(ours->hidden_states(model::input_of(b)), b, chunk);
        const at::Tensor r = (rows.logps.to(at::kDouble) - b.reference_logps).view({-1, 2}) * c.beta;
        CHECK(v.terms[2][0].item<double>() == (r.select(1, 0) > r.select(1, 1)).sum().item<double>());
        CHECK(v.terms[2][1].item<double>() == 3.0);
        CHECK(v.terms[4][0].item<double>() / 3 == Approx(rows.logps.view({-1, 2}).select(1, 0).mean().item<double>()).epsilon(1e-6));
      }
    }
}

TEST_CASE("dpo: the completions' log-probs do not depend on the chunk, and padded pairs count for nothing", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  auto m = model::make_model(cfg, 5, at::kFloat);
  data::Batch b = pair_batch(cfg.vocab_size);
  const model::CausalLM::Hidden h = m->hidden_states(model::input_of(b));
  const model::RowLogps whole = model::completion_logps(h, b, 0);
  for (const int64_t chunk : {1, 7, 72, 1000}) {
    const model::RowLogps part = model::completion_logps(h, b, chunk);
    CHECK(at::allclose(part.logps, whole.logps, 1e-6, 1e-5));
    CHECK(at::allclose(part.mean_logits, whole.mean_logits, 1e-6, 1e-6));
  }
  config::PreferenceConfig c;
  model::Objective objective(0);
  model::set_preference_loss(objective, c);
  const double three = objective(*m, b).sum.item<double>();
  b.pairs = 2;  // the third pair is padding (an evaluation batch's end): neither loss nor metrics
  const model::ObjectiveValue two = objective(*m, b);
  CHECK(two.count == 2);
  CHECK(two.terms[0][1].item<double>() == 2.0);
  CHECK(two.sum.item<double>() < three);
}
