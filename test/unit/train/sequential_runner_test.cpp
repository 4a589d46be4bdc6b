// The sequential step runner (train/sequential_runner.h): the loss over masked batches is the sum
// over trained targets divided by their global count, on one rank and on two; the model reads the
// batch's positions; observers see every micro-batch in order; a step's sums reach the host once.
// (The engine tests drive the same runner through engine_harness.cpp, every ZeRO stage and world size.)
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/data/batch.h"
#include "dstrain/device/host_read.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/z_loss.h"
#include "dstrain/zero/engine.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/train/sequential_runner.h"
#include "engine_harness.h"

using namespace dstrain;

namespace {

// Four rows of 16 tokens with labels of which about a third are ignored (a prompt, padding).
struct MaskedData {
  at::Tensor tokens, labels;
  MaskedData() {
    at::Generator g = at::detail::createCPUGenerator(7);
    tokens = at::randint(0, 64, {4, 16}, g, at::kLong);
    labels = at::randint(0, 64, {4, 16}, g, at::kLong);
    labels.masked_fill_(at::rand({4, 16}, g).lt(0.35), data::kIgnoreIndex);
    labels.narrow(1, 0, 5).fill_(data::kIgnoreIndex);
  }
  data::Batch rows(int64_t first, int64_t count) const {
    return data::labelled_batch(tokens.narrow(0, first, count), labels.narrow(0, first, count));
  }
};

// The reference: every trained token's cross-entropy, summed, divided by their count.
double reference_loss(const model::CausalLM& m, const MaskedData& d) {
  const at::Tensor logits = m.logits(d.tokens).reshape({-1, 64});
  const at::Tensor flat = d.labels.reshape({-1});
  const at::Tensor trained = flat.ne(data::kIgnoreIndex);
  const at::Tensor per_token = at::cross_entropy_loss(logits, flat.clamp_min(0), {}, at::Reduction::None);
  return (per_token * trained).sum().item<double>() / trained.sum().item<double>();
}

double loss_of(const train::StepTotals& totals) { return train::read_totals(totals).loss; }

std::vector<at::Tensor> grads_of(const model::CausalLM& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.tensor.grad().clone());
  return out;
}

}  // namespace

TEST_CASE("runner: a masked batch's loss is the sum over trained targets over their global count, on 1 and 2 ranks", "[train]") {
  const MaskedData d;
  const auto reference_model = test::make_tiny_model(config::Dtype::kFp32);
  const double want = reference_loss(*reference_model, d);
  const int64_t trained = d.labels.ne(data::kIgnoreIndex).sum().item<int64_t>();
  REQUIRE(trained < 4 * 16);
  // The reference's gradients: the mean over trained targets.
  const auto grad_model = test::make_tiny_model(config::Dtype::kFp32);
  model::mean_loss(*grad_model, d.tokens, d.labels).backward();
  const std::vector<at::Tensor> want_grads = grads_of(*grad_model);
  const model::Objective loss;

  SECTION("one rank, two micro-batches") {
    const auto m = test::make_tiny_model(config::Dtype::kFp32);
    train::SequentialRunner runner(*m, loss, nullptr, at::kCPU);
    const std::vector<data::Batch> batches{d.rows(0, 2), d.rows(2, 2)};
    const train::HostTotals r = train::read_totals(runner.train(batches, trained));
    CHECK(r.trained_targets == trained);
    CHECK(r.loss == Approx(want).epsilon(1e-6));
    CHECK(r.token_loss / static_cast<double>(r.trained_targets) == Approx(want).epsilon(1e-6));
    const std::vector<at::Tensor> got = grads_of(*m);
    for (size_t i = 0; i < got.size(); ++i) CHECK(at::allclose(got[i], want_grads[i], 1e-5, 1e-7));
    // Forward only: the same token sums, no gradients kept, one pass's sums on the host at once.
    const auto fresh = test::make_tiny_model(config::Dtype::kFp32);
    train::SequentialRunner eval(*fresh, loss, nullptr, at::kCPU);
    const train::HostTotals f = train::read_totals(eval.forward(batches));
    CHECK(f.trained_targets == trained);
    CHECK(f.token_loss / static_cast<double>(trained) == Approx(want).epsilon(1e-6));
    CHECK(eval.forward_batches() == 1);
    CHECK_FALSE(fresh->parameters()[0].tensor.grad().defined());
  }

  SECTION("two ranks: the global count is summed, each rank's part adds up to the mean") {
    std::mutex mu;
    double total = 0;
    std::vector<at::Tensor> summed;
    comm::run_on_threads(2, [&](comm::Communicator& comm) {
      const auto m = test::make_tiny_model(config::Dtype::kFp32);
      train::SequentialRunner runner(*m, loss, nullptr, at::kCPU);
      const std::vector<data::Batch> mine{d.rows(comm.rank() * 2, 1), d.rows(comm.rank() * 2 + 1, 1)};
      const int64_t global = train::global_loss_units(comm, mine);
      CHECK(global == trained);
      const double part = loss_of(runner.train(mine, global));
      const std::lock_guard<std::mutex> lock(mu);
      total += part;
      const std::vector<at::Tensor> g = grads_of(*m);
      if (summed.empty())
        summed = g;
      else
        for (size_t i = 0; i < g.size(); ++i) summed[i] += g[i];
    });
    CHECK(total == Approx(want).epsilon(1e-6));
    for (size_t i = 0; i < summed.size(); ++i) CHECK(at::allclose(summed[i], want_grads[i], 1e-5, 1e-7));
  }
}

TEST_CASE("runner: the MoE balance loss is in the step's loss, each micro-batch's by its share of the targets", "[train]") {
  const MaskedData d;
  auto m = model::make_model(test::tiny_moe_config(), 3);
  const model::Objective loss;
  const data::Batch whole = d.rows(0, 4);
  const model::ObjectiveValue parts = loss(*m, whole);
  REQUIRE(parts.aux.defined());
  REQUIRE(parts.aux.item<double>() > 0);
  (void)m->take_expert_load();
  train::SequentialRunner runner(*m, loss, nullptr, at::kCPU);
  const double got = loss_of(runner.train({whole}, whole.trained_targets));
  CHECK(got == Approx(parts.mean().item<double>()).epsilon(1e-9));
  CHECK(got > parts.sum.item<double>() / static_cast<double>(whole.trained_targets));
}

TEST_CASE("runner: the global trained-target count is exact beyond float32's 2^24", "[train]") {
  comm::run_on_threads(3, [](comm::Communicator& comm) {
    const int64_t mine = (int64_t{1} << 40) + 12345 + comm.rank();
    CHECK(comm::sum_exactly(comm, mine) == 3 * ((int64_t{1} << 40) + 12345) + 3);
  });
}

TEST_CASE("runner: the model reads the batch's positions (a packed document sees itself at position 0)", "[train]") {
  const auto m = test::make_tiny_model(config::Dtype::kFp32);
  // Row: document A (5 tokens, ending with 9) then document B (7 tokens); B alone, from position 0.
  const at::Tensor window = at::tensor({3, 1, 4, 1, 9, 2, 6, 5, 3, 5, 8, 7, 0}, at::kLong).view({1, 13});
  const data::Batch packed = data::pretraining_batch(window, 9, /*mask_documents=*/true, /*restart_positions=*/true);
  const at::Tensor packed_logits = m->logits(model::input_of(packed));
  const at::Tensor alone = m->logits(window.narrow(1, 5, 7).contiguous());
  CHECK(at::allclose(packed_logits.narrow(1, 5, 7), alone, 1e-5, 1e-6));
  // RoPE is relative: within the mask, where B starts does not matter (up to rounding). Without
  // the mask B attends to A, and restarting B's positions moves it relative to A: the model read
  // them. A's own positions, and so its logits, are the same either way.
  const data::Batch shifted = data::pretraining_batch(window, 9, true, false);
  CHECK(at::allclose(m->logits(model::input_of(shifted)).narrow(1, 5, 7), alone, 1e-5, 1e-6));
  const at::Tensor restarted = m->logits(model::input_of(data::pretraining_batch(window, 9, false, true)));
  const at::Tensor running = m->logits(model::input_of(data::pretraining_batch(window)));
  CHECK(at::equal(restarted.narrow(1, 0, 5), running.narrow(1, 0, 5)));
  CHECK_FALSE(at::allclose(restarted.narrow(1, 5, 7), running.narrow(1, 5, 7), 1e-4, 1e-5));
}

TEST_CASE("runner: observers see each micro-batch in order; a fault's on_loss reaches the result", "[train]") {
  struct Recorder final : train::MicroBatchObserver {
    std::vector<std::string> events;
    void before_micro(size_t m) override { events.push_back("before " + std::to_string(m)); }
    at::Tensor on_loss(size_t m, const at::Tensor& loss) override {
      events.push_back("loss " + std::to_string(m));
      return m == 1 ? loss * 0.0 : loss;  // micro-batch 1's loss dropped
    }
    void after_backward(size_t m) override { events.push_back("after " + std::to_string(m)); }
    void timed(size_t m, const train::MicroTiming& t) override {
      events.push_back("timed " + std::to_string(m) + " rows " + std::to_string(t.rows));
      CHECK(t.forward_ms >= 0);
      CHECK(t.backward_ms >= 0);
    }
  } recorder;
  const MaskedData d;
  const auto m = test::make_tiny_model(config::Dtype::kFp32);
  const model::Objective loss;
  train::SequentialRunner runner(*m, loss, nullptr, at::kCPU);
  runner.add_observer(&recorder);
  const std::vector<data::Batch> batches{d.rows(0, 1), d.rows(1, 3)};
  const int64_t global = batches[0].trained_targets + batches[1].trained_targets;
  const double got = loss_of(runner.train(batches, global));
  CHECK(recorder.events ==
        std::vector<std::string>{"before 0", "loss 0", "after 0", "timed 0 rows 1", "before 1", "loss 1", "after 1", "timed 1 rows 3"});
  const auto same = test::make_tiny_model(config::Dtype::kFp32);
  train::SequentialRunner plain(*same, loss, nullptr, at::kCPU);
  const double first_only = loss_of(plain.train({batches[0]}, global));
  CHECK(got == Approx(first_only).epsilon(1e-9));
}

TEST_CASE("runner: micro_batch_mean is the mean of micro-batch means, per_sample the mean of sample means", "[train]") {
  const MaskedData d;
  const model::Objective loss, chunked(5);  // the fused chunked head takes the same weights
  const std::vector<data::Batch> split{d.rows(0, 1), d.rows(1, 3)};
  // The references, from each part's own mean loss (model::ObjectiveValue::mean) and autograd.
  const auto reference = test::make_tiny_model(config::Dtype::kFp32);
  const double micro0 = loss(*reference, split[0]).mean().item<double>(), micro1 = loss(*reference, split[1]).mean().item<double>();
  double sample_sum = 0;
  for (int64_t r = 0; r < 4; ++r) sample_sum += loss(*reference, d.rows(r, 1)).mean().item<double>();
  REQUIRE(std::abs((micro0 + micro1) / 2 - sample_sum / 4) > 1e-4);  // the modes really differ on this data
  const auto grads_model = test::make_tiny_model(config::Dtype::kFp32);
  at::Tensor sample_mean = loss(*grads_model, d.rows(0, 1)).mean();
  for (int64_t r = 1; r < 4; ++r) sample_mean = sample_mean + loss(*grads_model, d.rows(r, 1)).mean();
  (sample_mean / 4).backward();
  const std::vector<at::Tensor> want_grads = grads_of(*grads_model);

  SECTION("micro_batch_mean") {
    const auto m = test::make_tiny_model(config::Dtype::kFp32);
    train::SequentialRunner runner(*m, loss, nullptr, at::kCPU);
    runner.set_normalization(config::LossNormalization::kMicroBatchMean);
    comm::run_on_threads(1, [&](comm::Communicator& comm) {
      CHECK(train::global_loss_units(comm, split, config::LossNormalization::kMicroBatchMean) == 2);
    });
    CHECK(loss_of(runner.train(split, 2)) == Approx((micro0 + micro1) / 2).epsilon(1e-6));
  }
  for (const model::Objective* which : {&loss, &chunked}) {
    DYNAMIC_SECTION("per_sample, " << (which == &loss ? "plain" : "chunked") << " head, rows split 1 + 3") {
      const auto m = test::make_tiny_model(config::Dtype::kFp32);
      train::SequentialRunner runner(*m, *which, nullptr, at::kCPU);
      runner.set_normalization(config::LossNormalization::kPerSample);
      std::vector<data::Batch> weighed = split;
      for (data::Batch& b : weighed) data::weigh_per_sample(b);
      CHECK(weighed[0].samples == 1);
      CHECK(weighed[1].samples == 3);
      CHECK(loss_of(runner.train(weighed, 4)) == Approx(sample_sum / 4).epsilon(1e-6));
      const std::vector<at::Tensor> got = grads_of(*m);
      for (size_t i = 0; i < got.size(); ++i) CHECK(at::allclose(got[i], want_grads[i], 1e-5, 1e-7));
    }
  }
  SECTION("per_sample: the samples of a packed row are its documents") {
    // Row: document A (5 tokens, ending with 9) then document B (7 tokens).
    const at::Tensor window = at::tensor({3, 1, 4, 1, 9, 2, 6, 5, 3, 5, 8, 7, 0}, at::kLong).view({1, 13});
    data::Batch packed = data::pretraining_batch(window, 9, /*mask_documents=*/true, /*restart_positions=*/true);
    data::weigh_per_sample(packed);
    CHECK(packed.samples == 2);
    const at::Tensor w = packed.target_weights.reshape({-1});
    CHECK(w[0].item<float>() == Approx(1.0 / 5));
    CHECK(w[11].item<float>() == Approx(1.0 / 7));
    CHECK(w.sum().item<double>() == Approx(2.0));
  }
}

namespace {

// Counts this thread's ops that read one value to the host (Tensor::item and what it dispatches to).
class ScalarReads {
 public:
  ScalarReads() {
    handle_ =
        at::addThreadLocalCallback(at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                     const std::string name = fn.name();
                                     if (name == "aten::item" || name == "aten::_local_scalar_dense") ++count();
                                     return nullptr;
                                   }).scopes({at::RecordScope::FUNCTION}));
  }
  ~ScalarReads() { at::removeCallback(handle_); }
  static int64_t& count() {
    thread_local int64_t n = 0;
    return n;
  }

 private:
  at::CallbackHandle handle_;
};

}  // namespace

TEST_CASE("runner: a training step reads its sums to the host once, at accumulation 1 and 16", "[train]") {
  const MaskedData d;
  for (const int64_t accumulation : {1, 16}) {
    for (const int stage : {0, 3}) {
      DYNAMIC_SECTION("accumulation " << accumulation << ", ZeRO-" << stage) {
        comm::run_on_threads(1, [&](comm::Communicator& comm) {
          const auto m = test::make_tiny_model(config::Dtype::kFp32);
          test::EngineSpec spec;
          spec.stage = stage;
          zero::Engine engine(*m, comm, test::engine_options(spec));
          model::Objective objective;
          model::add_z_loss_term(objective, 1e-3);  // a term's sums ride along too
          train::SequentialRunner runner(*m, objective, &engine, at::kCPU);
          std::vector<data::Batch> batches;
          for (int64_t i = 0; i < accumulation; ++i) batches.push_back(d.rows(i % 4, 1));
          const int64_t units = train::global_loss_units(comm, batches);  // before the step: the trainer's one small all-reduce
          for (int step = 0; step < 2; ++step) {
            const int64_t reads_before = device::host_reads();
            const ScalarReads items;
            ScalarReads::count() = 0;
            const train::StepTotals totals = runner.train(batches, units);
            const zero::StepResult r = engine.step(1e-3, step + 1, zero::StepScalars{{}, totals.values});
            CHECK(device::host_reads() - reads_before == 1);
            CHECK(ScalarReads::count() == 0);
            REQUIRE(r.device_sums.size() == 4);  // loss, token loss, z_loss's sum and count
            CHECK(std::isfinite(r.device_sums[0]));
            CHECK(r.device_sums[3] == static_cast<double>(totals.trained_targets));
          }
        });
      }
    }
  }
}

TEST_CASE("runner: a NaN loss on one rank makes every rank skip the step, without a read of its own", "[train]") {
  struct NanLoss final : train::MicroBatchObserver {
    at::Tensor on_loss(size_t m, const at::Tensor& loss) override { return m == 1 ? loss + std::nan("") : loss; }
  };
  const MaskedData d;
  std::mutex mu;
  std::vector<bool> skipped;
  comm::run_on_threads(2, [&](comm::Communicator& comm) {
    const auto m = test::make_tiny_model(config::Dtype::kFp32);
    zero::Engine engine(*m, comm, test::engine_options(test::EngineSpec{}));
    const model::Objective objective;
    train::SequentialRunner runner(*m, objective, &engine, at::kCPU);
    NanLoss nan;
    if (comm.rank() == 1) runner.add_observer(&nan);
    const std::vector<data::Batch> batches{d.rows(comm.rank() * 2, 1), d.rows(comm.rank() * 2 + 1, 1)};
    const train::StepTotals totals = runner.train(batches, train::global_loss_units(comm, batches));
    const zero::StepResult r = engine.step(1e-3, 1, zero::StepScalars{{}, totals.values});
    const std::lock_guard<std::mutex> lock(mu);
    skipped.push_back(r.skipped);
    CHECK(std::isnan(r.device_sums[0]));
    if (comm.rank() == 1) CHECK(std::isinf(r.grad_norm));  // its part of the norm: the NaN loss's rank
  });
  CHECK(skipped == std::vector<bool>{true, true});
}
