// Pipeline stages of a model (issue 39): models that hold some layer groups (model::HeldGroups)
// keep the whole model's parameters under their global names, with the same initial values, and
// their forwards chained (each stage's output a fresh leaf, its gradient passed back) give the
// whole model's loss and gradients bit for bit, for the dense and the MoE family (whose
// balance losses and expert load stay with the stage that holds the layer). With multi-token
// prediction, the stages pass the embeddings' output on beside the hidden states (as
// train::PipelineRunner does) and the last stage's MTP modules read it.
#include <ATen/ATen.h>

#include <map>

#include <torch/csrc/autograd/autograd.h>

#include "catch_torch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "engine_harness.h"

using namespace dstrain;

namespace {

struct Chained {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
};

// The model split at `cuts` (the first group of each stage after the first), run as a pipeline
// would: forward stage by stage, then backward from the last.
// The summed cross-entropy of the main head and of each MTP depth k (targets labels[:, k:]).
at::Tensor summed_loss(const model::CausalLM& model, const model::CausalLM::Hidden& h, const at::Tensor& labels) {
  at::Tensor loss = model::summed_cross_entropy(at::linear(h.hidden, h.head), labels);
  for (size_t k = 1; k <= h.mtp.size(); ++k) {
    const int64_t n = labels.size(1) - static_cast<int64_t>(k);
    loss = loss + model::summed_cross_entropy(at::linear(h.mtp[k - 1], h.head), labels.narrow(1, static_cast<int64_t>(k), n));
  }
  return model.close(h, loss);
}

Chained chained(const config::ModelConfig& c, at::ScalarType dtype, const std::vector<int>& cuts, const model::CausalLM::Input& in,
                const at::Tensor& labels) {
  std::vector<model::GroupRange> ranges;
  int first = 0;
  for (int cut : cuts) ranges.push_back({first, cut - 1}), first = cut;
  ranges.push_back({first, static_cast<int>(c.num_layers) + 1});
  std::vector<std::unique_ptr<model::CausalLM>> stages;
  for (const auto& r : ranges) stages.push_back(model::make_model(c, 5, dtype, nullptr, model::Init::kRandom, {r}));
  std::vector<at::Tensor> inputs, outputs, sides;
  at::Tensor x;
  const int64_t H = c.hidden_size;
  for (size_t s = 0; s < stages.size(); ++s) {
    model::CausalLM::Input stage_in = in;
    at::Tensor hidden_in = x;
    if (c.mtp_depth > 0 && x.defined()) stage_in.embedded = x.narrow(-1, H, H), hidden_in = x.narrow(-1, 0, H);
    const model::CausalLM::Hidden h = stages[s]->run_groups(ranges[s].first, ranges[s].last, hidden_in, stage_in);
    sides.push_back(h.aux);
    if (s + 1 == stages.size()) {
      REQUIRE(h.mtp.size() == static_cast<size_t>(c.mtp_depth));
      outputs.push_back(summed_loss(*stages[s], h, labels));
      break;
    }
    outputs.push_back(c.mtp_depth > 0 ? at::cat({h.hidden, s == 0 ? h.embedded : stage_in.embedded}, -1) : h.hidden);
    x = outputs.back().detach().requires_grad_(true);
    inputs.push_back(x);
  }
  Chained out;
  out.loss = outputs.back().detach();
  for (const at::Tensor& side : sides)
    if (side.defined()) out.loss = out.loss + side.detach();
  for (size_t s = stages.size(); s-- > 0;) {
    std::vector<at::Tensor> roots{outputs[s]}, grads{s + 1 == stages.size() ? at::ones_like(outputs[s]) : inputs[s].grad()};
    if (sides[s].defined()) roots.push_back(sides[s]), grads.push_back(at::ones_like(sides[s]));
    torch::autograd::backward(roots, grads);
  }
  for (const auto& stage : stages)
    for (const auto& p : stage->parameters()) {
      REQUIRE(out.grads.count(p.name) == 0);  // each parameter on one stage
      out.grads[p.name] = p.tensor.grad();
    }
  return out;
}

// exact: bit for bit; otherwise within double rounding (MTP's embedding gradient adds its two
// paths in another order when one of them crosses stages).
void check_stages(const config::ModelConfig& c, const std::vector<int>& cuts, at::ScalarType dtype = at::kDouble, bool exact = true) {
  at::manual_seed(3);
  const at::Tensor tokens = at::randint(0, c.vocab_size, {2, 8}, at::kLong), labels = at::randint(0, c.vocab_size, {2, 8}, at::kLong);
  const model::CausalLM::Input in{tokens, {}, {}};
  const auto whole = model::make_model(c, 5, dtype);
  const model::CausalLM::Hidden h = whole->hidden_states(in);
  REQUIRE(h.mtp.size() == static_cast<size_t>(c.mtp_depth));
  at::Tensor loss = summed_loss(*whole, h, labels);
  if (h.aux.defined()) loss = loss + h.aux;
  loss.backward();
  const Chained split = chained(c, dtype, cuts, in, labels);
  CHECK(split.loss.item<double>() == Approx(loss.item<double>()).epsilon(1e-14));  // the balance losses added per stage
  REQUIRE(split.grads.size() == whole->parameters().size());
  for (const auto& p : whole->parameters()) {
    INFO(p.name);
    REQUIRE(split.grads.count(p.name) == 1);
    if (exact)
      CHECK(at::equal(split.grads.at(p.name), p.tensor.grad()));
    else
      CHECK(at::allclose(split.grads.at(p.name), p.tensor.grad(), 1e-12, 1e-14));
  }
}

}  // namespace

TEST_CASE("a stage's model holds its groups' parameters under global names, initialised as the whole model's", "[model]") {
  config::ModelConfig c = test::tiny_model_config();
  c.num_layers = 4;
  const auto whole = model::make_model(c, 9);
  const auto middle = model::make_model(c, 9, at::kFloat, nullptr, model::Init::kRandom, {{2, 3}});
  REQUIRE(middle->parameters().size() == 2 * 9);
  CHECK(middle->parameters().front().name == "model.layers.1.input_layernorm.weight");
  CHECK(middle->parameters().back().name == "model.layers.2.mlp.down_proj.weight");
  std::map<std::string, at::Tensor> all;
  for (const auto& p : whole->parameters()) all[p.name] = p.tensor;
  for (const auto& p : middle->parameters()) CHECK(at::equal(p.tensor, all.at(p.name)));
  CHECK(middle->holds_group(2));
  CHECK_FALSE(middle->holds_group(0));
  CHECK_THROWS_WITH(middle->run_groups(0, 3, {}, {at::zeros({1, 4}, at::kLong), {}, {}}),
                    Catch::Contains("layer group 0, which this pipeline stage's model does not hold"));
}

TEST_CASE("a dense model's stages chained give the whole model's loss and gradients bit for bit", "[model]") {
  config::ModelConfig c = test::tiny_model_config();
  c.num_layers = 4;
  check_stages(c, {2});
  check_stages(c, {1, 3, 5});  // the head alone on the last stage
  check_stages(c, {2}, at::kFloat);
}

TEST_CASE("an MoE model's stages chained give the whole model's loss and gradients bit for bit", "[model]") {
  config::ModelConfig c = test::tiny_moe_config();
  c.num_layers = 3;
  c.aux_loss_alpha = 0.01;
  c.scoring_func = config::ScoringFunc::kSoftmax;
  c.topk_method = config::TopkMethod::kGreedy;
  check_stages(c, {2});
  check_stages(c, {1, 3});
}

TEST_CASE("a V3 model's stages with multi-token prediction give the whole model's loss and gradients", "[model][mtp]") {
  config::ModelConfig c = test::tiny_moe_config();
  c.aux_loss_alpha = 0.01;
  for (int64_t depth : {1, 2}) {
    INFO("mtp_depth " << depth);
    c.mtp_depth = depth;
    check_stages(c, {2}, at::kDouble, /*exact=*/false);
    check_stages(c, {1, 3}, at::kDouble, /*exact=*/false);  // a middle stage passes the embeddings on
    check_stages(c, {4}, at::kDouble, /*exact=*/false);     // the final norm, head and MTP alone on the last stage
  }
}
