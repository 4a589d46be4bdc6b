// The training step's collaborators on their own (train/): StepSums, BadStepPolicy,
// StepTriggers, ShardBalancer, DataPlan and Telemetry, in this process.
#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <fstream>
#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/train/bad_step_policy.h"
#include "dstrain/train/data_plan.h"
#include "dstrain/train/step_signals.h"
#include "dstrain/train/step_triggers.h"
#include "dstrain/train/telemetry.h"
#include "dstrain/zero/engine.h"
#include "test_support.h"

using namespace dstrain;

namespace {

// A bytes dataset of 200 tokens (lines of 9 letters and a newline, token 10) and a recipe that
// reads it in samples of 8 tokens: 2 ranks x 2 accumulation steps x micro-batches of 2.
config::Recipe plan_recipe(const std::string& dir, int64_t world) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += std::string(9, static_cast<char>('a' + i)) + "\n";
  write_file_atomic(dir + "/data.txt", text);
  config::Recipe r;
  r.data.path = dir + "/data.txt";
  r.data.seq_len = 8;
  r.model.vocab_size = 256;
  r.train.micro_batch_size = 2;
  r.train.gradient_accumulation_steps = 4 / world;
  r.train.steps = 3;
  r.launch.nproc_per_node = world;
  return r;
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor x = t.contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

zero::StepResult result(bool skipped, double grad_norm = 1.0) {
  zero::StepResult r;
  r.skipped = skipped, r.grad_norm = grad_norm;
  return r;
}

}  // namespace

TEST_CASE("StepSums: segments come back as summed; a row is one rank's slots", "[train]") {
  train::StepSums sums;
  const size_t signals = sums.add(train::StepSignals{true, false}.pack());
  const size_t rows = sums.add_row(1, 3, {7.0, 8.0});
  CHECK(sums.values() == std::vector<double>{1, 0, 0, 0, 7, 8, 0, 0});
  const std::vector<double> summed{1, 2, 1, 2, 7, 8, 5, 6};  // as if two ranks had added theirs
  CHECK(sums.segment(summed, rows) == std::vector<double>{1, 2, 7, 8, 5, 6});
  const train::StepSignals all = train::StepSignals::unpack(sums.segment(summed, signals));
  CHECK(all.save);
  CHECK(all.stop);  // summed: some rank asked
}

TEST_CASE("BadStepPolicy: fp16 overflows are the scaler's; skip counts; stop and repeated rollbacks end the run", "[train]") {
  config::Recipe r;
  r.train.max_bad_steps = 2;
  SECTION("fp16: a skipped step is an overflow, not a bad step") {
    r.precision.dtype = config::Dtype::kFp16;
    train::BadStepPolicy p(r, 1);
    CHECK(p.judge(3, result(true), 1.0) == train::BadStepPolicy::Action::kApply);
    CHECK(p.bad_steps() == 0);
  }
  SECTION("skip: up to max_bad_steps, then Error{kDiverged}") {
    r.train.on_bad_step = config::BadStepAction::kSkip;
    train::BadStepPolicy p(r, 1);
    CHECK(p.judge(1, result(false), 2.0) == train::BadStepPolicy::Action::kApply);
    CHECK(p.judge(2, result(false), std::nan("")) == train::BadStepPolicy::Action::kSkip);
    CHECK(p.judge(3, result(true, INFINITY), 2.0) == train::BadStepPolicy::Action::kSkip);
    CHECK(p.bad_steps() == 2);
    try {
      p.judge(4, result(true), 2.0);
      FAIL("a third bad step must stop the run");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kDiverged);
      CHECK_THAT(e.what(), Catch::Contains("train.max_bad_steps = 2"));
    }
  }
  SECTION("stop: the first bad step") {
    r.train.on_bad_step = config::BadStepAction::kStop;
    train::BadStepPolicy p(r, 1);
    CHECK_THROWS_AS(p.judge(5, result(false), INFINITY), Error);
  }
  SECTION("rollback: once per step; bad again at the same step is the data's fault") {
    r.train.on_bad_step = config::BadStepAction::kRollback;
    r.train.max_bad_steps = 5;
    train::BadStepPolicy p(r, 1);
    CHECK(p.judge(7, result(true), 1.0) == train::BadStepPolicy::Action::kRollback);
    CHECK_THAT(p.describe(), Catch::Contains("step 7: the gradient norm"));
    CHECK(p.judge(6, result(false), 1.0) == train::BadStepPolicy::Action::kApply);
    CHECK_THROWS_WITH(p.judge(7, result(false), std::nan("")), Catch::Contains("bad again after rolling back"));
  }
}

TEST_CASE("StepTriggers: the last step, every interval_steps, a SAVE_NOW file (rank 0, consumed), a time budget", "[train]") {
  test::TempDir dir;
  config::Recipe r;
  r.train.steps = 10;
  r.checkpoint.interval_steps = 4;
  const run::RunDir run_dir(dir.path());
  train::StepTriggers rank0(r, run_dir, 0), rank1(r, run_dir, 1);
  const train::StepSignals none;
  std::vector<int64_t> saved;
  for (int64_t done = 1; done <= 10; ++done)
    if (rank1.save_after(done, none)) saved.push_back(done);
  CHECK(saved == std::vector<int64_t>{4, 8, 10});
  CHECK(rank1.save_after(3, train::StepSignals{true, false}));  // some rank asked
  CHECK(rank1.save_after(3, train::StepSignals{false, true}));  // a stop saves too
  CHECK_FALSE(rank0.save_wanted());
  write_file_atomic(dir.path() + "/SAVE_NOW", "");
  CHECK_FALSE(rank1.save_wanted());  // only rank 0 reads the file
  CHECK(rank0.save_wanted());
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/SAVE_NOW"));
  CHECK_FALSE(rank0.save_wanted());
  CHECK_FALSE(rank0.stop_wanted());
  r.launch.max_time_minutes = 1e-9;  // a budget already spent
  train::StepTriggers budget(r, run_dir, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));  // 60 ns can be too soon to have passed
  CHECK(budget.stop_wanted());
  CHECK_THAT(budget.stop_reason(), Catch::Contains("wall-time budget"));
}

TEST_CASE("ShardBalancer: equal, weighted, auto after balance_steps; the weights survive a checkpoint", "[train]") {
  config::Recipe r;
  r.train.steps = 20;
  SECTION("equal shares: no weights, never rebalanced, nothing saved") {
    const train::ShardBalancer b(r, 0, 2);
    CHECK(b.weights().empty());
    CHECK_FALSE(b.rebalance_due(5));
    CHECK(b.state().empty());
  }
  SECTION("auto: equal until balance_steps, then by each rank's measured rate") {
    r.data.auto_balance = true;
    r.data.balance_steps = 3;
    train::ShardBalancer b(r, 1, 2);
    CHECK(b.weights() == std::vector<double>{1, 1});
    CHECK_FALSE(b.rebalance_due(2));
    CHECK(b.rebalance_due(3));
    b.add_compute(2.0, 10);
    b.add_compute(2.0, 30);
    CHECK(b.rate() == Approx(10.0));
    b.rebalance(3, {30.0, 10.0});
    CHECK(b.weights() == std::vector<double>{30.0, 10.0});
    train::ShardBalancer resumed(r, 1, 2);
    resumed.load_state(b.state());
    CHECK(resumed.weights() == b.weights());
  }
}

TEST_CASE("DataPlan: every rank's micro-batches are its part of the one-rank order; labels are shifted; documents cut", "[train]") {
  test::TempDir dir;
  const config::Recipe one = plan_recipe(dir.path(), 1);
  train::DataPlan whole(one, 0, 1);
  CHECK(whole.num_samples() == 24);  // (200 - 1) / 8
  whole.prefetch(1, 8, {});
  const std::vector<data::Batch> reference = whole.take();
  REQUIRE(reference.size() == 4);
  for (const data::Batch& b : reference) {
    CHECK(b.trained_targets == 16);
    CHECK(at::equal(b.labels.narrow(1, 0, 7), b.tokens.narrow(1, 1, 7)));  // the next token
  }
  SECTION("equal shares: micro-batch m of rank r is the one-rank run's micro-batch m x world + r") {
    const config::Recipe two = plan_recipe(dir.path(), 2);
    for (int rank = 0; rank < 2; ++rank) {
      train::DataPlan plan(two, rank, 2);
      plan.prefetch(1, 8, {});
      const std::vector<data::Batch> mine = plan.take();
      REQUIRE(mine.size() == 2);
      for (size_t m = 0; m < 2; ++m) CHECK(at::equal(mine[m].tokens, reference[m * 2 + static_cast<size_t>(rank)].tokens));
    }
  }
  SECTION("weighted shares [3, 1]: rank 0 reads the first 6 samples, rank 1 the last 2") {
    const config::Recipe two = plan_recipe(dir.path(), 2);
    train::DataPlan plan(two, 1, 2);
    plan.prefetch(1, 8, {3.0, 1.0});
    const std::vector<data::Batch> mine = plan.take();
    REQUIRE(mine.size() == 1);
    CHECK(at::equal(mine[0].tokens, reference[3].tokens));
  }
  SECTION("document_mask and reset_positions: documents end at the newline") {
    config::Recipe cut = one;
    cut.data.document_mask = cut.data.reset_positions = true;
    cut.data.eos_token = 10;
    train::DataPlan plan(cut, 0, 1);
    plan.prefetch(0, 0, {});
    const std::vector<data::Batch> batches = plan.take();
    const data::Batch& b = batches.at(0);
    for (int64_t row = 0; row < b.rows(); ++row) {
      const std::vector<int64_t> tokens = values(b.tokens[row]), positions = values(b.positions[row]);
      int64_t expected = 0;
      for (size_t t = 0; t < tokens.size(); ++t) {
        CHECK(positions[t] == expected);
        expected = tokens[t] == 10 ? 0 : expected + 1;
      }
    }
    CHECK(b.document_ids.defined());
  }
}

TEST_CASE("Telemetry: rank 0 writes one metrics line per step with the loss, throughput and the phases", "[train]") {
  test::TempDir dir;
  config::Recipe r;
  r.train.steps = 2;
  r.data.seq_len = 8;
  r.logging.steps_per_print = 0;
  r.logging.sinks = {config::Sink::kJsonl};
  r.logging.wall_clock_breakdown = true;
  const run::RunDir run_dir(dir.path());
  comm::run_on_threads(1, [&](comm::Communicator& comm) {
    train::Telemetry t(r, run_dir, comm, 0, 1);
    for (int64_t step = 1; step <= 2; ++step) {
      t.add_forward(3.0);
      t.add_backward(5.0);
      train::StepOutcome o;
      o.step = step, o.loss = 4.0 - static_cast<double>(step), o.lr = 1e-3, o.grad_norm = 0.5, o.cursor = step * 4, o.global_batch = 4;
      o.accumulation = 1, o.step_ms = 10.0;
      t.finish_step(o);
    }
  });
  std::ifstream in(run_dir.metrics_path());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[0], Catch::Contains("\"step\":1") && Catch::Contains("\"loss\":3"));
  CHECK_THAT(lines[1], Catch::Contains("\"step\":2") && Catch::Contains("\"loss\":2"));
  CHECK_THAT(lines[1], Catch::Contains("\"forward_ms\":3") && Catch::Contains("\"backward_ms\":5"));
  CHECK_THAT(lines[1], Catch::Contains("\"tokens_per_s\":"));
}
