// The reward model's objective (model/reward_loss.h) against the formula on the model's own
// logits (CausalLM::logits through the score head, then the score position picked by hand): the
// loss with center_rewards_coefficient and with margins, its metrics and every gradient, dense and MLA + MoE; and
// where a score is read (data/score_token.h). (dist.reward checks the same against TRL's RewardTrainer.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "catch_torch.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/data/score_token.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/reward_loss.h"
#include "engine_harness.h"
#include "model/same_gradients.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

// 3 real pairs and a padding pair of 10 tokens, each row scored at its own position.
data::Batch scored_batch(int64_t vocab) {
  at::Generator g = at::detail::createCPUGenerator(23);
  const at::Tensor tokens = at::randint(0, vocab, {8, 10}, g, at::kLong);
  data::Batch b = data::labelled_batch(tokens, at::full({8, 10}, data::kIgnoreIndex, at::kLong));
  b.pairs = 3;
  b.score_positions = at::tensor(std::vector<int64_t>{9, 4, 6, 9, 2, 7, 0, 0}, at::kLong);
  return b;
}

}  // namespace

TEST_CASE("reward: the loss, its metrics and every gradient equal the formula on the score head's logits", "[model]") {
  config::PreferenceConfig c;
  c.center_rewards_coefficient = 0.2;
  for (const bool moe : {false, true})
    for (const bool margins : {false, true}) DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense") << (margins ? ", margins" : "")) {
        config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
        cfg.aux_loss_alpha = 0;
        cfg.score_head = true;
        data::Batch b = scored_batch(cfg.vocab_size);
        // TRL's margin column: each real pair's, and the padding pair's (never read).
        if (margins) b.margins = at::tensor(std::vector<float>{0.5f, -1.25f, 2.0f, 9.0f}, at::kFloat);
        auto ours = model::make_model(cfg, 5, at::kFloat), theirs = model::make_model(cfg, 5, at::kFloat);
        REQUIRE(ours->parameters().back().name == "score.weight");
        model::Objective objective;
        model::set_reward_loss(objective, c);
        const model::ObjectiveValue v = objective(*ours, b);
        CHECK(v.count == 3);
        // The formula: logits [B, T, 1] from the model, each row's at its position.
        const at::Tensor logits = theirs->logits(model::input_of(b));
        REQUIRE(logits.size(-1) == 1);
        const at::Tensor scores = logits.squeeze(-1).gather(1, b.score_positions.unsqueeze(1)).squeeze(1).narrow(0, 0, 6).view({3, 2});
        const at::Tensor rc = scores.select(1, 0), rr = scores.select(1, 1);
        const at::Tensor margin = margins ? b.margins.narrow(0, 0, 3) : at::zeros({3});
        const at::Tensor want = (-at::log_sigmoid(rc - rr - margin) + 0.2 * (rc + rr).pow(2)).sum();
        CHECK(v.sum.item<double>() == Approx(want.item<double>()).epsilon(1e-6));
        v.sum.backward();
        want.backward();
        test::check_same_gradients(*ours, *theirs);
        // accuracy (strict), margin, mean_reward over the six real rows.
        REQUIRE(v.terms.size(0) == 3);
        CHECK(v.terms[0][0].item<double>() == (rc > rr).sum().item<double>());
        CHECK(v.terms[0][1].item<double>() == 3.0);
        CHECK(v.terms[1][0].item<double>() == Approx((rc - rr).sum().item<double>()).margin(1e-6));
        CHECK(v.terms[2][0].item<double>() == Approx(scores.sum().item<double>()).margin(1e-6));
        CHECK(v.terms[2][1].item<double>() == 6.0);
      }
}

TEST_CASE("reward: a score head replaces lm_head, and a causal LM's folder may lack it", "[model]") {
  config::ModelConfig cfg = test::tiny_model_config();
  cfg.score_head = true;
  const auto shapes = model::model_tensor_shapes(cfg);
  bool score = false, lm_head = false;
  for (const auto& s : shapes) {
    if (s.name == "score.weight") {
      score = true;
      CHECK(s.shape == std::vector<int64_t>{1, cfg.hidden_size});
      CHECK_FALSE(s.required);
    }
    if (s.name == "lm_head.weight") lm_head = true;
  }
  CHECK(score);
  CHECK_FALSE(lm_head);
  CHECK(model::starts_fresh_in_folder(cfg, "score.weight"));
  cfg.score_head = false;
  CHECK_FALSE(model::starts_fresh_in_folder(cfg, "score.weight"));
}

TEST_CASE("reward: the score is read at the last token that is not the pad token, as transformers reads it", "[data]") {
  CHECK(data::score_position({5, 7, 9}, 2) == 2);
  CHECK(data::score_position({5, 7, 2}, 2) == 1);  // a turn that ends in an eos that is also the pad
  CHECK(data::score_position({5, 2, 7, 2, 2}, 2) == 2);
  CHECK(data::score_position({2, 2}, 2) == 0);  // transformers' argmax over an all-zero mask
  CHECK(data::score_position({}, 2) == 0);
}

TEST_CASE("reward: a batch without score positions, or a model without a score head, is an internal error", "[model]") {
  config::ModelConfig cfg = test::tiny_model_config();
  config::PreferenceConfig c;
  model::Objective objective;
  model::set_reward_loss(objective, c);
  data::Batch b = scored_batch(cfg.vocab_size);
  CHECK_THROWS_WITH(objective(*model::make_model(cfg, 5, at::kFloat), b), Catch::Contains("without a score head"));
  cfg.score_head = true;
  b.score_positions = at::Tensor();
  CHECK_THROWS_WITH(objective(*model::make_model(cfg, 5, at::kFloat), b), Catch::Contains("without score positions"));
}
