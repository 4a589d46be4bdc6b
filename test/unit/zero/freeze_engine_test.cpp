// Frozen parameters in the ZeRO engine (train.freeze): they stay bitwise at their initial values
// at every stage, with expert parallelism too, hold no gradient, master copy or Adam states, and
// the parameters that train follow the one-rank run; mix_from (TR-DPO) moves a frozen copy.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dstrain/comm/thread_communicator.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/freeze.h"
#include "engine_harness.h"

using namespace dstrain;
using dstrain::test::EngineRun;
using dstrain::test::EngineSpec;
using dstrain::test::worst_relative;

namespace {

// Every frozen parameter's final value is its initial one, bit for bit; every other one moved.
// Returns the trained elements.
int64_t check_frozen_at_initial(const EngineRun& run, const config::ModelConfig& cfg, const std::vector<std::string>& freeze) {
  const auto initial_model = model::make_model(cfg, 1234);  // the harness's seed, every expert
  std::map<std::string, at::Tensor> initial;
  for (const auto& p : initial_model->parameters()) initial[p.name] = p.tensor.detach().reshape({-1});
  const model::FrozenSet set = model::frozen_set(cfg, freeze);
  REQUIRE(run.names.size() == initial.size());
  int64_t offset = 0, trained = 0, frozen_seen = 0;
  for (size_t i = 0; i < run.names.size(); ++i) {
    const at::Tensor final_value = run.master.narrow(0, offset, run.numels[i]);
    offset += run.numels[i];
    INFO(run.names[i]);
    if (set.names.count(run.names[i])) {
      CHECK(at::equal(final_value, initial.at(run.names[i])));
      ++frozen_seen;
    } else {
      CHECK_FALSE(at::equal(final_value, initial.at(run.names[i])));
      trained += run.numels[i];
    }
  }
  CHECK(frozen_seen == static_cast<int64_t>(set.names.size()));
  CHECK(trained == set.trainable());
  return trained;
}

// The model states of a rank with frozen parameters: master and Adam states (and at stage 2/3
// gradients) for its share of the trained parameters only, padding aside.
void check_frozen_memory(const EngineRun& run, int64_t trained, int world, int stage) {
  const int64_t share = stage == 0 ? trained : trained / world, slack = 64 * 16 * world;  // at most one padded tail per unit
  INFO("master " << run.memory.master << " B for " << trained << " trained elements over " << world);
  CHECK(run.memory.master >= 4 * share);
  CHECK(run.memory.master <= 4 * (share + slack));
  CHECK(run.memory.optimizer == 2 * run.memory.master);
  if (stage >= 2) CHECK(run.memory.grads <= 4 * (share + slack));
  CHECK(run.memory.formula_optimizer == 12 * share);
}

}  // namespace

TEST_CASE("engine: frozen parameters stay at their initial values at stages 0-3, hold no optimizer state, the rest trains as one rank",
          "[engine][freeze]") {
  const std::vector<std::string> freeze = {"model.embed_tokens.*", "model.layers.0.*"};
  EngineSpec one;
  one.freeze = freeze;
  const EngineRun reference = test::run_engine(one);
  const int64_t trained = check_frozen_at_initial(reference, test::tiny_model_config(), freeze);
  CHECK(worst_relative(reference.losses, test::run_engine({}).losses) > 1e-4);  // freezing changed the run
  for (int stage = 0; stage <= 3; ++stage)
    for (bool overlap : {false, true}) {
      EngineSpec spec = one;
      spec.world = 2, spec.stage = stage, spec.overlap_comm = overlap, spec.bucket = overlap ? 300 : spec.bucket;
      INFO("stage " << stage << (overlap ? ", overlap_comm, small buckets" : ""));
      const EngineRun run = test::run_engine(spec);
      check_frozen_at_initial(run, test::tiny_model_config(), freeze);
      CHECK(worst_relative(run.losses, reference.losses) <= 1e-5);
      CHECK(worst_relative(run.grad_norms, reference.grad_norms) <= 1e-4);
      CHECK((run.master - reference.master).abs().max().item<double>() <= 1e-4);
      check_frozen_memory(run, trained, 2, stage);
    }
}

TEST_CASE("engine: frozen parameters with optimizer offload (stage 2, stage 3 with parameter offload, the delayed update) and in bf16",
          "[engine][freeze]") {
  const std::vector<std::string> freeze = {"model.embed_tokens.*", "norms", "model.layers.1.mlp.*"};
  EngineSpec one;
  one.freeze = freeze;
  const EngineRun reference = test::run_engine(one);
  for (int variant = 0; variant < 3; ++variant) {
    EngineSpec spec = one;
    spec.world = 2, spec.offload = true, spec.offload_chunk = 1000;
    spec.stage = variant == 0 ? 2 : 3;
    spec.offload_param = variant >= 1;
    spec.delayed_update = variant == 2, spec.delayed_after = 2;
    INFO("variant " << variant);
    const EngineRun run = test::run_engine(spec);
    check_frozen_at_initial(run, test::tiny_model_config(), freeze);
    if (variant < 2) CHECK(worst_relative(run.losses, reference.losses) <= 1e-5);  // the delayed update is another method
  }
  EngineSpec bf16 = one;
  bf16.dtype = config::Dtype::kBf16, bf16.world = 2, bf16.stage = 3;
  const EngineRun run = test::run_engine(bf16);
  // What the engine holds of a frozen parameter: its initial value in bf16, unchanged.
  const auto initial = model::make_model(test::tiny_model_config(), 1234, at::kBFloat16);
  const model::FrozenSet set = model::frozen_set(test::tiny_model_config(), freeze);
  int64_t offset = 0;
  for (size_t i = 0; i < run.names.size(); ++i) {
    if (set.names.count(run.names[i])) {
      INFO(run.names[i]);
      CHECK(at::equal(run.master.narrow(0, offset, run.numels[i]), initial->parameters()[i].tensor.detach().to(at::kFloat).reshape({-1})));
    }
    offset += run.numels[i];
  }
}

TEST_CASE("engine: frozen routed experts and layers with expert parallelism over 2 ranks, stages 0-3",
          "[engine][freeze][expert-parallel]") {
  const std::vector<std::string> freeze = {"model.layers.0.*", "experts", "model.layers.1.self_attn.*"};
  EngineSpec one;
  one.expert_parallel = 1, one.freeze = freeze;
  const EngineRun reference = test::run_engine(one);
  check_frozen_at_initial(reference, test::tiny_moe_config(), freeze);
  for (int stage = 0; stage <= 3; ++stage) {
    EngineSpec spec = one;
    spec.world = 2, spec.stage = stage, spec.expert_parallel = 2;
    INFO("stage " << stage);
    const EngineRun run = test::run_engine(spec);
    check_frozen_at_initial(run, test::tiny_moe_config(), freeze);
    CHECK(worst_relative(run.losses, reference.losses) <= 1e-5);
  }
}

TEST_CASE("train.freeze: roles and globs select from the whole model; nothing matched and everything frozen are refused by key",
          "[freeze]") {
  const config::ModelConfig moe = test::tiny_moe_config();
  const model::FrozenSet experts = model::frozen_set(moe, {"experts"});
  for (const auto& name : experts.names) CHECK(name.find(".mlp.experts.") != std::string::npos);
  CHECK(experts.names.size() == 2 * 4 * 3);  // 2 MoE layers x 4 experts x 3 projections, on every rank whatever it holds
  const model::FrozenSet layers = model::frozen_set(moe, {"model.layers.[0-1].*"});
  CHECK(layers.names.count("model.layers.1.mlp.experts.3.down_proj.weight"));
  CHECK_FALSE(layers.names.count("model.layers.2.input_layernorm.weight"));
  CHECK(model::frozen_set(moe, {"router"}).frozen_routers == 2);
  CHECK(model::frozen_set(moe, {"norms"}).names.count("model.norm.weight"));
  CHECK_THROWS_WITH(
      model::frozen_set(moe, {"norms", "model.embed.*"}),
      Catch::Contains("train.freeze[1]: 'model.embed.*' matches no parameter") && Catch::Contains("model.embed_tokens.weight"));
  CHECK_THROWS_WITH(model::frozen_set(moe, {"embedding"}), Catch::Contains("train.freeze[0]") && Catch::Contains("embeddings, attention"));
  CHECK_THROWS_WITH(model::frozen_set(test::tiny_model_config(), {"experts"}), Catch::Contains("no parameters of that role"));
  CHECK_THROWS_WITH(model::frozen_set(moe, {"*"}), Catch::Contains("freezes every parameter"));
}

TEST_CASE("engine: mix_from moves a frozen copy toward another model as TRL's SyncRefModelCallback, at stages 0-3", "[engine][freeze]") {
  const config::ModelConfig cfg = test::tiny_model_config();
  std::map<std::string, at::Tensor> want;  // target.mul_(1 - alpha).add_(source, alpha), parameter by parameter
  {
    const auto target = model::make_model(cfg, 1), source = model::make_model(cfg, 2);
    for (size_t i = 0; i < target->parameters().size(); ++i)
      want[target->parameters()[i].name] =
          target->parameters()[i].tensor.detach().clone().mul_(1.0 - 0.6).add_(source->parameters()[i].tensor.detach(), 0.6);
  }
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage << ", 2 ranks");
    std::map<std::string, at::Tensor> got;
    comm::run_on_threads(2, [&](comm::Communicator& comm) {
      const auto target = model::make_model(cfg, 1), source = model::make_model(cfg, 2);
      for (size_t i = 0; i < target->parameters().size(); ++i) target->freeze(i);
      EngineSpec spec;
      spec.world = 2, spec.stage = stage;
      zero::Engine copy(*target, comm, test::engine_options(spec)), policy(*source, comm, test::engine_options(spec));
      copy.mix_from(policy, 0.6);
      const model::NamedTensors full = comm.rank() == 0 ? copy.full_state() : model::NamedTensors{};
      copy.gather_full_state(full);  // the copy's values as a checkpoint holds them (every rank's chunk)
      for (const auto& t : full) got[t.name] = t.tensor;
    });
    REQUIRE(got.size() == want.size());
    for (const auto& [name, value] : want) {
      INFO(name);
      CHECK(at::equal(got.at(name), value));
    }
  }
}
