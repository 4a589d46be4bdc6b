// The ZeRO engine in one process: ranks are threads on the in-process communicator. Single-rank
// stage 0 is the reference; every stage at 1, 2 and 4 ranks must give its losses, gradient norms
// and final master weights within fp32 rounding.
#include <ATen/ATen.h>
#include "catch_torch.h"

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/zero/engine.h"
#include "engine_harness.h"

using namespace dstrain;
using dstrain::test::EngineRun;
using dstrain::test::EngineSpec;
using dstrain::test::worst_relative;

namespace {

double worst_absolute(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// How far the run's master weights are from the reference's, over how far training moved them.
double relative_displacement_error(const EngineRun& run, const EngineRun& reference) {
  REQUIRE(reference.initial.numel() == reference.master.numel());  // the reference holds every parameter
  return ((run.master - reference.master).norm() / (reference.master - reference.initial).norm()).item<double>();
}

// The master weights are compared two ways, because Adam amplifies rounding where a gradient is
// near its eps: an expert's weight whose gradient sums to ~1e-8 out of terms a thousand times
// larger differs by ~0.5% between reduction orders, and lr * g / (|g| + eps) turns that into up to
// lr * 0.5% / 4 = 1.2e-5 (seen with ATen's AVX2 kernels; 2.2e-5 on an AMD EPYC), whatever the Adam
// ISA. So: the weights as a whole within 10x the tolerance of what training moved them, and no
// single weight off by 1% of one learning-rate step (a mis-sharded or unreduced element is off
// by about a whole step).
void check_matches(const EngineRun& run, const EngineRun& reference, double tolerance) {
  const double lr = test::EngineSpec{}.lr;
  INFO("losses: " << run.losses.front() << " ... " << run.losses.back() << " vs " << reference.losses.front() << " ... "
                  << reference.losses.back());
  CHECK(worst_relative(run.losses, reference.losses) <= tolerance);
  CHECK(worst_relative(run.grad_norms, reference.grad_norms) <= 10 * tolerance);
  CHECK(relative_displacement_error(run, reference) <= 10 * tolerance);
  CHECK(worst_absolute(run.master, reference.master) <= 0.01 * lr);
  CHECK(worst_absolute(run.exp_avg_sq, reference.exp_avg_sq) <= 10 * tolerance);
}

}  // namespace

TEST_CASE("engine: stages 0-3 at 1, 2 and 4 ranks give the single-rank losses and weights", "[engine]") {
  const EngineRun reference = test::run_engine({});
  REQUIRE(reference.losses.size() == 4);
  CHECK(reference.losses.back() < reference.losses.front());  // it trains
  for (int world : {1, 2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      DYNAMIC_SECTION("stage " << stage << " at " << world << " rank(s)") {
        EngineSpec spec;
        spec.world = world;
        spec.stage = stage;
        check_matches(test::run_engine(spec), reference, 2e-6);
      }
    }
  }
}

TEST_CASE("engine: expert parallelism 1, 2 and 4 at stages 0-3 on 4 ranks gives the single-rank MoE run", "[engine][expert-parallel]") {
  EngineSpec one;
  one.expert_parallel = 1;
  const EngineRun reference = test::run_engine(one);
  CHECK(reference.losses.back() < reference.losses.front());  // it trains
  for (int ep : {1, 2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      DYNAMIC_SECTION("E = " << ep << ", stage " << stage) {
        EngineSpec spec;
        spec.world = 4, spec.stage = stage, spec.expert_parallel = ep;
        spec.overlap_comm = stage == 3, spec.bucket = stage == 2 ? 700 : spec.bucket;
        // Every expert's state, gathered under its global name: the whole model's, in its order.
        const EngineRun run = test::run_engine(spec);
        check_matches(run, reference, 2e-6);
        if (ep > 1) CHECK(run.parameters < reference.parameters);  // a rank holds only its experts
        CHECK(run.master.numel() == reference.master.numel());
      }
    }
  }
  SECTION("E = 2 with the optimizer and the parameters offloaded (stage 3)") {
    EngineSpec spec;
    spec.world = 4, spec.stage = 3, spec.expert_parallel = 2, spec.offload = spec.offload_param = true, spec.offload_chunk = 300;
    check_matches(test::run_engine(spec), reference, 2e-6);
  }
  SECTION("E = 2 over 2 ranks: each expert on one rank (no expert data parallelism)") {
    EngineSpec spec;
    spec.world = 2, spec.stage = 2, spec.expert_parallel = 2;
    check_matches(test::run_engine(spec), reference, 2e-6);
  }
}

TEST_CASE("engine: delayed update (DPU): the update of step t is applied at the end of step t+1, alike at every stage and rank count",
          "[engine]") {
  EngineSpec plain;
  plain.stage = 2, plain.offload = true, plain.offload_chunk = 300;
  EngineSpec delayed = plain;
  delayed.delayed_update = true;
  SECTION("one step: the same update as without the delay") {
    plain.steps = delayed.steps = 1;
    const EngineRun a = test::run_engine(plain), b = test::run_engine(delayed);
    CHECK(at::equal(a.master, b.master));
    CHECK(at::equal(a.exp_avg_sq, b.exp_avg_sq));
  }
  SECTION("step 2 still runs on the initial parameters; step 3 on the first update's") {
    plain.steps = delayed.steps = 2;
    EngineSpec frozen = plain;
    frozen.lr = 0;  // Adam with lr 0 leaves the parameters as they are
    const EngineRun d = test::run_engine(delayed), f = test::run_engine(frozen), p = test::run_engine(plain);
    CHECK(d.losses[1] == f.losses[1]);
    CHECK(d.losses[1] != p.losses[1]);
  }
  SECTION("after 2 undelayed updates: steps 1-3 as without the delay, step 4 on the second update's parameters") {
    plain.steps = delayed.steps = 4;
    delayed.delayed_after = 2;
    const EngineRun d = test::run_engine(delayed), p = test::run_engine(plain);
    for (size_t i = 0; i < 3; ++i) CHECK(d.losses[i] == p.losses[i]);
    CHECK(d.losses[3] != p.losses[3]);
  }
  SECTION("ZeRO 1-3 on 2 ranks (and the parameter shard offloaded) give the one-rank delayed run") {
    delayed.steps = plain.steps = 6;
    const EngineRun reference = test::run_engine(delayed);
    CHECK(reference.losses.back() < reference.losses.front());                       // it trains
    CHECK(worst_relative(reference.losses, test::run_engine(plain).losses) > 1e-4);  // and is another method
    for (int stage : {1, 2, 3}) {
      DYNAMIC_SECTION("stage " << stage) {
        EngineSpec spec = delayed;
        spec.world = 2, spec.stage = stage, spec.offload_param = stage == 3;
        check_matches(test::run_engine(spec), reference, 2e-6);
      }
    }
  }
}

TEST_CASE("engine: with expert parallelism an overflow on any rank skips the step everywhere, stage 0 included",
          "[engine][expert-parallel]") {
  for (int stage : {0, 2}) {
    for (int rank : {1, 3}) {
      DYNAMIC_SECTION("stage " << stage << ", overflow on rank " << rank) {
        EngineSpec spec;
        spec.world = 4, spec.stage = stage, spec.expert_parallel = 2, spec.steps = 3, spec.overflow_at_step = 2, spec.overflow_rank = rank;
        const EngineRun run = test::run_engine(spec);
        CHECK(run.skipped == std::vector<bool>{false, true, false});
        CHECK(run.skipped_steps == 1);
      }
    }
  }
}

// Two ranks at each of `stages`, with `variant` applied, against the single-rank reference.
template <typename Variant>
void check_two_ranks(std::initializer_list<int> stages, Variant variant) {
  const EngineRun reference = test::run_engine({});
  for (int stage : stages) {
    DYNAMIC_SECTION("stage " << stage) {
      EngineSpec spec;
      spec.world = 2;
      spec.stage = stage;
      variant(spec);
      check_matches(test::run_engine(spec), reference, 2e-6);
    }
  }
}

TEST_CASE("engine: overlap_comm, small buckets and stage-3 prefetch change nothing", "[engine]") {
  check_two_ranks({1, 2, 3}, [](EngineSpec& s) { s.overlap_comm = true, s.bucket = 700; });
}

TEST_CASE("engine: activation checkpointing at stages 0-3 gives no recompute's losses and weights bit for bit", "[engine]") {
  // Stage 3 with overlap_comm: the recomputed layer's parameters are gathered again for its backward.
  for (int stage : {0, 1, 2, 3}) {
    EngineSpec spec;
    spec.world = 2, spec.stage = stage, spec.overlap_comm = true;
    const EngineRun plain = test::run_engine(spec);
    for (const auto mode : {config::Recompute::kFull, config::Recompute::kSelective}) {
      DYNAMIC_SECTION("stage " << stage << ", " << config::name(mode)) {
        spec.recompute = mode;
        const EngineRun run = test::run_engine(spec);
        CHECK(run.losses == plain.losses);
        CHECK(run.grad_norms == plain.grad_norms);
        CHECK(at::equal(run.master, plain.master));
      }
    }
  }
}

TEST_CASE("engine: optimizer offload in small chunks matches the on-device optimizer", "[engine]") {
  check_two_ranks({1, 3}, [](EngineSpec& s) { s.offload = true, s.offload_chunk = 500; });
}

TEST_CASE("engine: parameter offload at stage 3 gives the optimizer offload's run bit for bit, shards in host memory", "[engine]") {
  for (const bool overlap : {false, true}) {
    DYNAMIC_SECTION("overlap_comm " << overlap) {
      EngineSpec spec;
      spec.world = 2, spec.stage = 3, spec.offload = true, spec.offload_chunk = 500, spec.overlap_comm = overlap;
      const EngineRun optimizer_only = test::run_engine(spec);
      spec.offload_param = true;
      const EngineRun both = test::run_engine(spec);
      CHECK(both.losses == optimizer_only.losses);
      CHECK(at::equal(both.master, optimizer_only.master));
      // The parameter shard is counted in host memory, no longer on the device.
      CHECK(both.memory.host_params == optimizer_only.memory.params - both.memory.params);
      CHECK(both.memory.host_params > 0);
    }
  }
  EngineSpec alone;
  alone.world = 1, alone.stage = 3, alone.offload_param = true;
  CHECK_THROWS_WITH(test::run_engine(alone), Catch::Contains("zero.offload_param needs zero.offload_optimizer"));
}

TEST_CASE("engine: bf16 at stage 2 over 2 ranks follows the single-rank bf16 run", "[engine]") {
  EngineSpec one;
  one.dtype = config::Dtype::kBf16;
  const EngineRun reference = test::run_engine(one);
  EngineSpec two = one;
  two.world = 2;
  two.stage = 2;
  const EngineRun run = test::run_engine(two);
  // bf16 activations and gradients: the ranks' micro-batches differ in shape from the single
  // rank's and their gradients are summed in another order, so they round differently, and Adam
  // moves an element whose tiny gradient changed sign by 2 x lr. The whole stays close.
  CHECK(worst_relative(run.losses, reference.losses) <= 1e-2);
  // The yardstick: how far bf16 itself takes the single rank from fp32.
  auto drift = [](const at::Tensor& a, const at::Tensor& b) { return ((a - b).norm() / b.norm()).item<double>(); };
  const double bf16_vs_fp32 = drift(reference.master, test::run_engine({}).master);
  INFO("relative drift of the master weights: " << drift(run.master, reference.master) << "; bf16 vs fp32 on one rank: " << bf16_vs_fp32);
  CHECK(drift(run.master, reference.master) <= 0.5 * bf16_vs_fp32);
}

TEST_CASE("engine: an overflow on one rank's shard skips the step on every rank, at every stage", "[engine]") {
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("stage " << stage) {
      EngineSpec spec;
      spec.dtype = config::Dtype::kFp16, spec.world = 4, spec.stage = stage, spec.overflow_at_step = 3, spec.overflow_rank = 3;
      CHECK(test::run_engine(spec).skipped == std::vector<bool>{false, false, true, false});
    }
  }
}

TEST_CASE("engine: fp16 skips an overflowing step on every rank and halves the scale (hysteresis 1)", "[engine]") {
  EngineSpec spec;
  spec.dtype = config::Dtype::kFp16;
  spec.world = 2;
  spec.stage = 2;
  spec.overflow_at_step = 2;  // 1-based
  const EngineRun run = test::run_engine(spec);
  REQUIRE(run.skipped.size() == 4);
  CHECK(run.skipped == std::vector<bool>{false, true, false, false});
  CHECK(run.scales == std::vector<double>{256, 256, 128, 128});  // 2^8, halved after the overflow
  CHECK(run.skipped_steps == 1);
  EngineSpec again = spec;
  again.stage = 0;
  again.world = 1;
  const EngineRun single = test::run_engine(again);
  CHECK(single.skipped == run.skipped);
  CHECK(worst_relative(run.losses, single.losses) <= 1e-2);
  // The schedule multiplies the loss by the scale before backward and the engine divides it out:
  // the first step's gradient norm is fp32's (1/256 of it, were the loss not scaled).
  EngineSpec fp32 = again;
  fp32.dtype = config::Dtype::kFp32;
  CHECK(run.grad_norms.at(0) == Approx(test::run_engine(fp32).grad_norms.at(0)).epsilon(2e-2));
}

TEST_CASE("engine: the memory report follows the ZeRO formulas per stage", "[engine]") {
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("stage " << stage) {
      EngineSpec spec;
      spec.world = 2;
      spec.stage = stage;
      spec.steps = 1;
      const EngineRun run = test::run_engine(spec);
      const zero::MemoryReport& m = run.memory;
      const int64_t formula = stage == 0 ? 12 * run.parameters : 12 * run.parameters / 2;
      CHECK(m.formula_optimizer == formula);
      // Units are padded to a multiple of 16 x ranks elements: a few hundred bytes at most here.
      CHECK(m.master + m.optimizer >= formula);
      CHECK(m.master + m.optimizer <= formula + formula / 20);
      if (stage >= 2) CHECK(m.grads < 4 * run.parameters);
      if (stage == 3) CHECK(m.params < 4 * run.parameters);
    }
  }
}

TEST_CASE("engine: mismatched collectives between ranks fail with the op named instead of hanging", "[engine]") {
  try {
    comm::run_on_threads(2, [](comm::Communicator& comm) {
      at::Tensor t = at::ones({4});
      if (comm.rank() == 0)
        comm.all_reduce(t)->wait();
      else
        comm.barrier()->wait();
    });
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kComm);
    CHECK_THAT(e.what(), Catch::Contains("barrier") && Catch::Contains("all_reduce"));
  }
}
