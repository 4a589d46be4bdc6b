// The pipeline runner and the evaluator in-process (train/pipeline_runner.h, train/evaluator.h):
// two stages on two threads train as the sequential runner does in one process (loss, gradient
// norm, a term's sums), their forwards give the last stage the same cross-entropy sums, and the
// evaluator gives the same validation loss through either runner, at one and two ranks.
#include <ATen/ATen.h>

#include <mutex>
#include <vector>

#include "catch_torch.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/data/token_file.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/z_loss.h"
#include "dstrain/data/data_sources.h"
#include "dstrain/train/evaluator.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/train/pipeline_runner.h"
#include "dstrain/train/sequential_runner.h"
#include "dstrain/zero/engine.h"
#include "engine_harness.h"
#include "test_support.h"

using namespace dstrain;

namespace {

config::Recipe pipeline_recipe(pipeline::ScheduleKind schedule) {
  config::Recipe r;
  r.model = test::tiny_model_config();
  r.model.num_layers = 4;
  r.data.seq_len = 16;
  r.parallel.pipeline_parallel_size = 2;
  r.pipeline.schedule = schedule;
  r.zero.stage = 1;
  r.eval.micro_batch_size = 2;
  return r;
}

std::vector<data::Batch> step_batches(int64_t step) {
  at::Generator g = at::detail::createCPUGenerator(100 + static_cast<uint64_t>(step));
  const at::Tensor tokens = at::randint(0, 64, {4, 16}, g, at::kLong);
  at::Tensor labels = at::randint(0, 64, {4, 16}, g, at::kLong);
  labels.masked_fill_(at::rand({4, 16}, g).lt(0.3), data::kIgnoreIndex);
  std::vector<data::Batch> out;
  for (int64_t m = 0; m < 4; ++m) out.push_back(data::labelled_batch(tokens.narrow(0, m, 1), labels.narrow(0, m, 1)));
  return out;
}

struct Steps {
  std::vector<double> loss, grad_norm, z_loss, forward_tokens;
};

// Two steps, then one forward pass, through `runner`; values as the engine summed them over every rank.
void run_steps(train::StepRunner& runner, zero::Engine& engine, Steps& out) {
  for (int64_t step = 0; step < 2; ++step) {
    const std::vector<data::Batch> batches = step_batches(step);
    int64_t units = 0;
    for (const data::Batch& b : batches) units += train::loss_units(b, config::LossNormalization::kGlobalTokens);
    const train::StepTotals totals = runner.train(batches, units);
    const zero::StepResult r = engine.step(1e-2, step + 1, zero::StepScalars{{}, totals.values});
    const train::HostTotals all = train::read_totals(r.device_sums, totals.trained_targets);
    out.loss.push_back(all.loss), out.grad_norm.push_back(r.grad_norm);
    out.z_loss.push_back(all.term_sums.at(0) / all.term_counts.at(0));
  }
  out.forward_tokens.push_back(train::read_totals(runner.forward(step_batches(5))).token_loss);
}

}  // namespace

TEST_CASE("PipelineRunner: 2 stages on 2 threads train as the sequential runner in one process", "[train]") {
  for (const auto schedule : {pipeline::ScheduleKind::kGpipe, pipeline::ScheduleKind::k1F1B, pipeline::ScheduleKind::kZbH1}) {
    DYNAMIC_SECTION("schedule " << static_cast<int>(schedule)) {
      const config::Recipe r = pipeline_recipe(schedule);
      model::Objective objective(7);
      model::add_z_loss_term(objective, 0.01);
      Steps one;
      comm::run_on_threads(1, [&](comm::Communicator& comm) {
        auto m = model::make_model(r.model, 3);
        config::Recipe single = r;
        single.parallel.pipeline_parallel_size = 1;
        zero::Engine engine(*m, comm, zero::options_from(single, at::kCPU));
        train::SequentialRunner runner(*m, objective, &engine, at::kCPU);
        run_steps(runner, engine, one);
      });
      std::mutex mu;
      Steps last;
      comm::run_on_threads(2, [&](comm::Communicator& world) {
        auto m = model::make_model(r.model, 3, at::kFloat, nullptr, model::Init::kRandom, train::pipeline_rank_groups(r, world.rank()));
        const std::unique_ptr<comm::Communicator> data_parallel = world.split({{0}, {1}});
        zero::Engine engine(*m, *data_parallel, zero::options_from(r, at::kCPU), {}, &world);
        train::PipelineRunner runner(r, *m, objective, engine, world, at::kCPU);
        CHECK(runner.forward_batches() == 4);
        Steps mine;
        run_steps(runner, engine, mine);
        const std::lock_guard<std::mutex> lock(mu);
        if (world.rank() == 1) last = mine;
        if (world.rank() == 0) CHECK(mine.forward_tokens[0] == 0);  // the first stage computes no loss
      });
      for (size_t s = 0; s < 2; ++s) {
        CHECK(last.loss[s] == Approx(one.loss[s]).epsilon(1e-5));
        CHECK(last.grad_norm[s] == Approx(one.grad_norm[s]).epsilon(1e-5));
        CHECK(last.z_loss[s] == Approx(one.z_loss[s]).epsilon(1e-5));
      }
      CHECK(last.forward_tokens[0] == Approx(one.forward_tokens[0]).epsilon(1e-5));
    }
  }
}

TEST_CASE("Evaluator: the same validation loss through the sequential runner at 1 and 2 ranks and a 2-stage pipeline", "[train]") {
  test::TempDir tmp;
  std::vector<int64_t> tokens(16 * 11 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7 + i / 5) % 64);
  data::write_llmc(tmp.path() + "/held.bin", tokens, 7);
  config::Recipe r = pipeline_recipe(pipeline::ScheduleKind::k1F1B);
  r.zero.stage = 3;  // the pipeline's forwards gather every parameter first
  auto sets = [&] { return data::open_eval_files({tmp.path() + "/held.bin"}, {}, config::DataFormat::kLlmc, 16); };
  const model::Objective objective;
  std::mutex mu;
  std::vector<double> losses;
  std::vector<int64_t> counted;
  for (const int world_size : {1, 2}) {
    comm::run_on_threads(world_size, [&](comm::Communicator& comm) {
      auto m = model::make_model(r.model, 3);
      config::Recipe flat = r;
      flat.parallel.pipeline_parallel_size = 1;
      zero::Engine engine(*m, comm, zero::options_from(flat, at::kCPU));
      train::SequentialRunner runner(*m, objective, &engine, at::kCPU);
      train::Evaluator evaluator(sets(), train::eval_options_from(r), *m, &engine, runner, comm, comm);
      const train::EvalResult result = evaluator.evaluate().at(0);
      const std::lock_guard<std::mutex> lock(mu);
      if (comm.rank() == 0) losses.push_back(result.loss), counted.push_back(result.tokens);
    });
  }
  comm::run_on_threads(2, [&](comm::Communicator& world) {
    auto m = model::make_model(r.model, 3, at::kFloat, nullptr, model::Init::kRandom, train::pipeline_rank_groups(r, world.rank()));
    const std::unique_ptr<comm::Communicator> data_parallel = world.split({{0}, {1}});
    zero::Engine engine(*m, *data_parallel, zero::options_from(r, at::kCPU), {}, &world);
    train::PipelineRunner runner(r, *m, objective, engine, world, at::kCPU);
    train::Evaluator evaluator(sets(), train::eval_options_from(r), *m, &engine, runner, *data_parallel, world);
    const train::EvalResult result = evaluator.evaluate().at(0);
    const std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) losses.push_back(result.loss), counted.push_back(result.tokens);
  });
  REQUIRE(losses.size() == 3);
  CHECK(counted == std::vector<int64_t>{16 * 11, 16 * 11, 16 * 11});
  CHECK(losses[1] == losses[0]);  // summed in rank order: the same at any world size
  CHECK(losses[2] == Approx(losses[0]).epsilon(1e-6));
  CHECK(losses[0] > 3.0);  // an untrained model on a 64-token vocabulary: about log 64
}
