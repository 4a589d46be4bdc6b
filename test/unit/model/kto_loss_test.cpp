// KTO's loss (model/kto_loss.h) against its formula on the whole logits with plain autograd: the
// loss and every parameter's gradient, plain and chunked, the KL estimate and the metrics.
// (dist.kto checks it against TRL's KTOTrainer.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/kto_loss.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "engine_harness.h"
#include "model/same_gradients.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

constexpr int64_t kPrompt[] = {3, 3, 5, 5, 2, 2, 4, 4}, kEnd[] = {11, 8, 9, 11, 6, 10, 7, 9};

// 4 examples of 12 tokens (rows 2i the example, 2i + 1 its KL sequence), the third undesirable
// and the fourth padding (`real` 3); reference log-probs that make the KL estimate positive.
data::Batch kto_batch(int64_t vocab) {
  at::Generator g = at::detail::createCPUGenerator(29);
  const at::Tensor tokens = at::randint(0, vocab, {8, 12}, g, at::kLong);
  at::Tensor labels = at::full({8, 12}, data::kIgnoreIndex, at::kLong);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t t = kPrompt[r] - 1; t < kEnd[r]; ++t) labels[r][t] = tokens[r][t + 1];
  data::Batch b = data::labelled_batch(tokens, labels);
  b.pairs = 3;
  b.desirable = at::tensor({1, 1, 0, 0}, at::kInt).to(at::kBool);
  b.reference_logps = at::tensor({-20.0, -33.0, -18.0, -36.0, -22.0, -38.0, 0.0, 0.0}, at::kDouble);
  return b;
}

struct Expected {
  at::Tensor loss;  // summed over the examples, with grad
  double kl = 0, chosen_reward = 0, rejected_reward = 0, margin = 0, chosen_logp = 0, rejected_logp = 0;
};

// TRL's _compute_loss on the whole logits.
Expected formula(const model::CausalLM& m, const data::Batch& b, const config::PreferenceConfig& c) {
  const model::CausalLM::Hidden h = m.hidden_states(model::input_of(b));
  const at::Tensor logp = at::log_softmax(at::linear(h.hidden, h.head).to(at::kFloat), -1);
  const at::Tensor mask = b.labels.ne(data::kIgnoreIndex);
  const at::Tensor sums = (logp.gather(-1, b.labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1).view({-1, 2}).narrow(0, 0, 3);
  const at::Tensor ref = b.reference_logps.to(at::kFloat).view({-1, 2}).narrow(0, 0, 3);
  const at::Tensor logratio = sums.select(1, 0) - ref.select(1, 0);
  const at::Tensor kl = c.loss_type[0] == "kto" ? (sums.select(1, 1) - ref.select(1, 1)).mean().clamp_min(0).detach() : at::zeros({});
  const at::Tensor chosen = logratio.narrow(0, 0, 2), rejected = logratio.narrow(0, 2, 1);
  at::Tensor losses;
  if (c.loss_type[0] == "kto")
    losses = at::cat({c.desirable_weight * (1 - at::sigmoid(c.beta * (chosen - kl))),
                      c.undesirable_weight * (1 - at::sigmoid(c.beta * (kl - rejected)))});
  else
    losses = at::cat({c.desirable_weight * (1 - at::sigmoid(c.beta * chosen)), c.undesirable_weight * at::sigmoid(c.beta * rejected)});
  Expected e;
  e.loss = m.close(h, losses.sum());
  e.kl = kl.item<double>();
  e.chosen_reward = c.beta * chosen.mean().item<double>(), e.rejected_reward = c.beta * rejected.mean().item<double>();
  e.margin = e.chosen_reward - e.rejected_reward;
  e.chosen_logp = sums.select(1, 0).narrow(0, 0, 2).mean().item<double>(), e.rejected_logp = sums[2][0].item<double>();
  return e;
}

}  // namespace

TEST_CASE("kto: the loss and every gradient equal TRL's formula on the whole logits (plain and chunked)", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  const data::Batch b = kto_batch(cfg.vocab_size);
  config::PreferenceConfig kto;
  kto.loss_type = {"kto"}, kto.beta = 0.3, kto.desirable_weight = 1.4, kto.undesirable_weight = 0.6;
  config::PreferenceConfig apo = kto;
  apo.loss_type = {"apo_zero_unpaired"};
  for (const auto& [label, c] : {std::pair{"kto", kto}, std::pair{"apo_zero_unpaired", apo}})
    for (const int64_t chunk : {int64_t{0}, int64_t{5}}) {
      DYNAMIC_SECTION(label << ", chunk " << chunk) {
        auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
        model::Objective objective(chunk);
        model::set_kto_loss(objective, c);
        REQUIRE(objective.metrics().size() == model::kto_metric_names().size());
        const model::ObjectiveValue v = objective(*ours, b);
        const Expected want = formula(*theirs, b, c);
        if (c.loss_type[0] == "kto") CHECK(want.kl > 0);  // the shift is exercised, not clamped away
        CHECK(v.count == 3);
        CHECK(v.sum.item<double>() == Approx(want.loss.item<double>()).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "kl") == Approx(want.kl).epsilon(1e-5).margin(1e-7));
        CHECK(test::metric_value(objective, v, "rewards/chosen") == Approx(want.chosen_reward).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "rewards/rejected") == Approx(want.rejected_reward).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "rewards/margins") == Approx(want.margin).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "logps/chosen") == Approx(want.chosen_logp).epsilon(1e-6));
        CHECK(test::metric_value(objective, v, "logps/rejected") == Approx(want.rejected_logp).epsilon(1e-6));
        v.sum.backward();
        want.loss.backward();
        test::check_same_gradients(*ours, *theirs);
      }
    }
}

TEST_CASE("kto: a micro-batch of one kind logs no margin, and padding alone logs nothing", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  data::Batch b = kto_batch(cfg.vocab_size);
  b.desirable = at::tensor({1, 1, 1, 0}, at::kInt).to(at::kBool);
  config::PreferenceConfig c;
  c.loss_type = {"kto"};
  model::Objective objective(0);
  model::set_kto_loss(objective, c);
  const auto m = model::make_model(cfg, 5, at::kFloat);
  const auto count = [&](const model::ObjectiveValue& v, size_t i) { return v.terms[static_cast<int64_t>(i)][1].item<double>(); };
  const model::ObjectiveValue v = objective(*m, b);
  CHECK(count(v, 0) == 1);  // kl: one micro-batch
  CHECK(count(v, 1) == 3);  // rewards/chosen: three desirable examples
  CHECK(count(v, 2) == 0);  // rewards/rejected: none
  CHECK(count(v, 3) == 0);  // rewards/margins: not both kinds
  b.pairs = 0;
  const model::ObjectiveValue empty = objective(*m, b);
  for (size_t i = 0; i < model::kto_metric_names().size(); ++i) CHECK(count(empty, i) == 0);
  CHECK(empty.sum.item<double>() == 0);
}

TEST_CASE("kto: a batch without labels is a bug, named", "[model]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  data::Batch b = kto_batch(cfg.vocab_size);
  b.desirable = at::Tensor();
  model::Objective objective(0);
  config::PreferenceConfig c;
  c.loss_type = {"kto"};
  model::set_kto_loss(objective, c);
  CHECK_THROWS_WITH(objective(*model::make_model(cfg, 5, at::kFloat), b), Catch::Contains("without its reference log-probs or labels"));
}
