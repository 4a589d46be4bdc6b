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
#include "model/same_gradients.h"
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

// RPO with LD-DPO (sigmoid + w x sft on sums weighted by alpha past each pair's shorter completion)
// or WPO (hinge x each pair's weight) on the whole logits, summed over pairs.
at::Tensor options_reference_loss(const model::CausalLM& m, const data::Batch& b, const config::PreferenceConfig& c, double sft_weight) {
  const model::CausalLM::Hidden h = m.hidden_states(model::input_of(b));
  const at::Tensor logits = at::linear(h.hidden, h.head).to(at::kFloat), logp = at::log_softmax(logits, -1);
  const at::Tensor mask = b.labels.ne(data::kIgnoreIndex).to(at::kFloat);
  const at::Tensor token = logp.gather(-1, b.labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask;
  const at::Tensor tokens = mask.sum(-1), position = mask.cumsum(-1);
  const at::Tensor shared = std::get<0>(tokens.view({-1, 2}).min(1, true)).expand({-1, 2}).reshape({-1, 1});
  const at::Tensor weight = at::where(position <= shared, at::ones_like(mask), at::full_like(mask, c.ld_alpha));
  const at::Tensor ratio = ((token * weight).sum(-1) - b.reference_logps.to(at::kFloat)).view({-1, 2});
  const at::Tensor delta = ratio.select(1, 0) - ratio.select(1, 1);
  at::Tensor loss;
  if (c.use_weighting) {
    const at::Tensor square = at::logsumexp(2 * logits, -1) - 2 * at::logsumexp(logits, -1);
    const at::Tensor wpo = (((token - square) * mask).sum(-1) / tokens).exp().view({-1, 2}).detach();
    loss = (at::relu(1 - c.beta * delta) * wpo.select(1, 0) * wpo.select(1, 1)).sum();
  } else {
    const at::Tensor chosen_mean =
        token.view({-1, 2, token.size(-1)}).select(1, 0).sum() / mask.view({-1, 2, mask.size(-1)}).select(1, 0).sum();
    loss = (-at::log_sigmoid(c.beta * delta)).sum() - sft_weight * 3 * chosen_mean;  // 3 pairs x the token mean
  }
  return m.close(h, loss);
}

}  // namespace

TEST_CASE("dpo: RPO's sft term with LD-DPO's weighted sums, and WPO's weights, equal the formula with every gradient", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  data::Batch b = pair_batch(cfg.vocab_size);
  CHECK(data::chosen_targets(b) == 9 + 5 + 5);  // rows 0, 2, 4 train 9, 5 and 5 targets
  b.chosen_targets_per_pair = static_cast<double>(data::chosen_targets(b)) / 3.0;
  for (const bool wpo : {false, true})
    for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
      DYNAMIC_SECTION((wpo ? "WPO hinge" : "RPO + LD-DPO") << ", chunk " << chunk) {
        config::PreferenceConfig c;
        c.beta = 0.3;
        if (wpo)
          c.loss_type = {"hinge"}, c.use_weighting = true;
        else
          c.loss_type = {"sigmoid", "sft"}, c.loss_weights = {1.0, 0.7}, c.ld_alpha = 0.4;
        auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
        model::Objective objective(chunk);
        model::set_preference_loss(objective, c);
        const model::ObjectiveValue v = objective(*ours, b);
        const at::Tensor want = options_reference_loss(*theirs, b, c, 0.7);
        CHECK(v.sum.item<double>() == Approx(want.item<double>()).epsilon(1e-6));
        v.sum.backward();
        want.backward();
        test::check_same_gradients(*ours, *theirs);
      }
    }
  // A batch without the step's chosen targets is a bug, named.
  config::PreferenceConfig c;
  c.loss_type = {"sft"};
  model::Objective objective(0);
  model::set_preference_loss(objective, c);
  b.chosen_targets_per_pair = 0;
  CHECK_THROWS_WITH(objective(*model::make_model(cfg, 5, at::kFloat), b), Catch::Contains("without the step's chosen targets"));
}

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
        test::check_same_gradients(*ours, *theirs);
        // rewards/accuracies: strict, over the pairs; logps/chosen: the chosen sums' mean.
        const model::RowLogps rows = model::completion_logps(ours->hidden_states(model::input_of(b)), b, chunk);
        const at::Tensor r = (rows.logps.to(at::kDouble) - b.reference_logps).view({-1, 2}) * c.beta;
        CHECK(v.terms[2][0].item<double>() == (r.select(1, 0) > r.select(1, 1)).sum().item<double>());
        CHECK(v.terms[2][1].item<double>() == 3.0);
        CHECK(v.terms[4][0].item<double>() / 3 == Approx(rows.logps.view({-1, 2}).select(1, 0).mean().item<double>()).epsilon(1e-6));
      }
    }
}

TEST_CASE("dpo: AOT's losses sort the batch's log-ratios, with every gradient through the sort (aot, aot_unpaired)", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  const data::Batch b = pair_batch(cfg.vocab_size);
  config::PreferenceConfig c;
  c.beta = 0.3, c.label_smoothing = 0.1, c.loss_type = {"aot", "aot_unpaired"}, c.loss_weights = {1.0, 0.5};
  for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
    DYNAMIC_SECTION("chunk " << chunk) {
      auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
      model::Objective objective(chunk);
      model::set_preference_loss(objective, c);
      const model::ObjectiveValue v = objective(*ours, b);
      const model::CausalLM::Hidden h = theirs->hidden_states(model::input_of(b));
      const at::Tensor logp = at::log_softmax(at::linear(h.hidden, h.head).to(at::kFloat), -1);
      const at::Tensor mask = b.labels.ne(data::kIgnoreIndex);
      const at::Tensor rows = (logp.gather(-1, b.labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1).view({-1, 2});
      const at::Tensor ref = b.reference_logps.to(at::kFloat).view({-1, 2});
      const auto sorted = [](const at::Tensor& x) { return std::get<0>(at::sort(x)); };
      const auto smoothed = [&](const at::Tensor& z) {
        return (-at::log_sigmoid(c.beta * z) * (1 - c.label_smoothing) - at::log_sigmoid(-c.beta * z) * c.label_smoothing).sum();
      };
      const at::Tensor aot = smoothed(sorted(rows.select(1, 0) - rows.select(1, 1)) - sorted(ref.select(1, 0) - ref.select(1, 1)));
      const at::Tensor unpaired = smoothed(sorted(rows.select(1, 0) - ref.select(1, 0)) - sorted(rows.select(1, 1) - ref.select(1, 1)));
      const at::Tensor want = theirs->close(h, aot + 0.5 * unpaired);
      CHECK(v.sum.item<double>() == Approx(want.item<double>()).epsilon(1e-6));
      v.sum.backward();
      want.backward();
      test::check_same_gradients(*ours, *theirs);
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
