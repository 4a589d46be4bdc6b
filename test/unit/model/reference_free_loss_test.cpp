// The reference-free preference objectives (model/reference_free_loss.h: cpo, simpo, orpo) against
// their formulas on the whole logits with plain autograd: the loss and every parameter's gradient,
// plain and chunked, and the metrics the formulas give. (dist.dpo checks them against TRL's
// CPOTrainer and ORPOTrainer.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/reference_free_loss.h"
#include "engine_harness.h"
#include "model/same_gradients.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

constexpr int64_t kPrompt[] = {3, 3, 5, 5, 2, 2}, kEnd[] = {11, 8, 9, 11, 6, 10};

// 3 pairs of 12 tokens: prompts untrained, completions of different lengths, rows end padded.
data::Batch pair_batch(int64_t vocab) {
  at::Generator g = at::detail::createCPUGenerator(23);
  const at::Tensor tokens = at::randint(0, vocab, {6, 12}, g, at::kLong);
  at::Tensor labels = at::full({6, 12}, data::kIgnoreIndex, at::kLong);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t t = kPrompt[r] - 1; t < kEnd[r]; ++t) labels[r][t] = tokens[r][t + 1];
  data::Batch b = data::labelled_batch(tokens, labels);
  b.pairs = 3;
  return b;
}

// The chosen rows' every target from position 0 (ORPO's NLL), written out by hand.
at::Tensor whole_chosen_labels(const data::Batch& b) {
  at::Tensor labels = at::full_like(b.labels, data::kIgnoreIndex);
  for (int64_t r = 0; r < 6; r += 2)
    for (int64_t t = 0; t < kEnd[r]; ++t) labels[r][t] = b.tokens[r][t + 1];
  return labels;
}

struct Expected {
  at::Tensor loss;  // summed over pairs, with grad
  double nll = 0, chosen_logp = 0, chosen_reward = 0, log_odds = 0;
};

// The loss of `kind` on the whole logits, as TRL's CPOTrainer and ORPOTrainer write it (times the 3 pairs).
Expected formula(const model::CausalLM& m, const data::Batch& b, config::TrainObjective kind, const config::PreferenceConfig& c) {
  const model::CausalLM::Hidden h = m.hidden_states(model::input_of(b));
  const at::Tensor logp = at::log_softmax(at::linear(h.hidden, h.head).to(at::kFloat), -1);
  const auto sums_over = [&](const at::Tensor& labels) {
    const at::Tensor mask = labels.ne(data::kIgnoreIndex);
    return std::make_pair((logp.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1), mask.sum(-1).to(at::kFloat));
  };
  const auto [sums, tokens] = sums_over(b.labels);
  const bool orpo = kind == config::TrainObjective::kOrpo;
  const std::string type = orpo ? "orpo" : kind == config::TrainObjective::kSimpo ? "simpo" : c.loss_type[0];
  const at::Tensor lp = (orpo || type == "ipo" || type == "simpo" ? sums / tokens : sums).view({-1, 2});
  const at::Tensor lc = lp.select(1, 0), lr = lp.select(1, 1);
  Expected e;
  at::Tensor per_pair, nll;
  if (orpo) {
    const at::Tensor log_odds = (lc - lr) - (at::log(1 - at::exp(lc)) - at::log(1 - at::exp(lr)));
    per_pair = -c.beta * at::log_sigmoid(log_odds);
    const auto [whole, count] = sums_over(whole_chosen_labels(b));
    nll = -whole.sum() / count.sum();
    e.log_odds = log_odds.mean().item<double>();
    e.chosen_reward = c.beta * lc.mean().item<double>();
  } else {
    const auto reward = [&](const at::Tensor& x) { return c.alpha != 0 ? (1 - at::pow(at::exp(x), -c.alpha)) / c.alpha : x; };
    at::Tensor d = reward(lc) - reward(lr);
    e.chosen_reward = c.beta * reward(lc).mean().item<double>();
    if (type == "simpo") d = d - c.simpo_gamma / c.beta;
    if (type == "hinge")
      per_pair = at::relu(1 - c.beta * d);
    else if (type == "ipo")
      per_pair = (d - 1 / (2 * c.beta)).pow(2);
    else
      per_pair = -at::log_sigmoid(c.beta * d) * (1 - c.label_smoothing) - at::log_sigmoid(-c.beta * d) * c.label_smoothing;
    nll = -sums.view({-1, 2}).select(1, 0).sum() / tokens.view({-1, 2}).select(1, 0).sum();
  }
  const double nll_weight = orpo ? 1.0 : c.cpo_alpha;
  e.loss = m.close(h, per_pair.sum() + 3 * nll_weight * nll);
  e.nll = nll.item<double>();
  e.chosen_logp = lc.mean().item<double>();
  return e;
}

struct Case {
  std::string label;
  config::TrainObjective kind;
  config::PreferenceConfig c;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  config::PreferenceConfig c;
  c.beta = 0.3, c.label_smoothing = 0.1, c.cpo_alpha = 0.7;
  out.push_back({"cpo sigmoid, label smoothing", config::TrainObjective::kCpo, c});
  c.label_smoothing = 0, c.loss_type = {"hinge"};
  out.push_back({"cpo hinge", config::TrainObjective::kCpo, c});
  c.loss_type = {"ipo"};
  out.push_back({"cpo ipo", config::TrainObjective::kCpo, c});
  c.loss_type = {"sigmoid"}, c.cpo_alpha = 0, c.beta = 2.0, c.simpo_gamma = 0.8;
  out.push_back({"simpo", config::TrainObjective::kSimpo, c});
  c.alpha = 0.25, c.cpo_alpha = 0.5;
  out.push_back({"simpo with AlphaPO and the NLL", config::TrainObjective::kSimpo, c});
  config::PreferenceConfig o;
  o.beta = 0.4;
  out.push_back({"orpo", config::TrainObjective::kOrpo, o});
  return out;
}

}  // namespace

TEST_CASE("cpo, simpo, orpo: the loss and every gradient equal the formula on the whole logits (plain and chunked)", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  data::Batch b = pair_batch(cfg.vocab_size);
  CHECK(data::chosen_sequence_targets(b) == 11 + 9 + 6);  // every target of rows 0, 2, 4 from position 0
  for (const Case& k : cases())
    for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
      DYNAMIC_SECTION(k.label << ", chunk " << chunk) {
        const bool orpo = k.kind == config::TrainObjective::kOrpo;
        b.chosen_targets_per_pair = static_cast<double>(orpo ? data::chosen_sequence_targets(b) : data::chosen_targets(b)) / 3.0;
        auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
        model::Objective objective(chunk);
        model::set_reference_free_loss(objective, k.kind, k.c);
        REQUIRE(objective.metrics().size() == model::reference_free_metric_names(k.kind).size());
        const model::ObjectiveValue v = objective(*ours, b);
        const Expected want = formula(*theirs, b, k.kind, k.c);
        CHECK(v.count == 3);
        CHECK(v.sum.item<double>() == Approx(want.loss.item<double>()).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "nll_loss") == Approx(want.nll).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "logps/chosen") == Approx(want.chosen_logp).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "rewards/chosen") == Approx(want.chosen_reward).epsilon(1e-6));
        // A difference of near-equal float32 log-odds: digits lost to cancellation on both sides.
        if (orpo) CHECK(test::metric_value(objective, v, "log_odds_chosen") == Approx(want.log_odds).epsilon(1e-5).margin(1e-7));
        v.sum.backward();
        want.loss.backward();
        test::check_same_gradients(*ours, *theirs);
      }
    }
}

TEST_CASE("cpo: a batch without the step's chosen targets is a bug, named", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  data::Batch b = pair_batch(cfg.vocab_size);
  model::Objective objective(0);
  model::set_reference_free_loss(objective, config::TrainObjective::kCpo, config::PreferenceConfig{});
  CHECK_THROWS_WITH(objective(*model::make_model(cfg, 5, at::kFloat), b), Catch::Contains("without the step's chosen targets"));
}
