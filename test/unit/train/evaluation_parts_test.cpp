// The parts of evaluation (issue 37) below the trainer: eval.split never lets a held-out document
// into a training sample; the best/early-stopping rule and its checkpointed state; the rank-order
// sum of the validation loss; the metrics row; keep_best's retention and ckpt/best.
#include <ATen/ATen.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>

#include "catch_torch.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/data/document_split.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/metrics/jsonl_sink.h"
#include "dstrain/metrics/sinks.h"
#include "dstrain/data/data_sources.h"
#include "dstrain/data/text_windows.h"
#include "dstrain/train/eval_tracker.h"
#include "test_support.h"

using namespace dstrain;
namespace fs = std::filesystem;

namespace {
// 40 documents of 10..49 tokens; every token of document d is d + 1 (0 is never used).
std::string documents_dataset(const std::string& dir) {
  std::vector<std::vector<int64_t>> docs;
  for (int64_t d = 0; d < 40; ++d) docs.emplace_back(static_cast<size_t>(10 + d), d + 1);
  const std::string prefix = dir + "/docs";
  data::write_megatron(prefix, docs);
  return prefix;
}
}  // namespace

TEST_CASE("eval.split: no held-out document is in any training sample; the split is seeded and whole", "[data]") {
  test::TempDir tmp;
  const std::string prefix = documents_dataset(tmp.path());
  const int64_t seq_len = 16;
  auto split = data::split_documents(data::open_token_file(prefix, config::DataFormat::kMegatron, seq_len), -1, 0.2, 7, seq_len);
  REQUIRE(split.documents == 40);
  REQUIRE(split.held_out_documents.size() == 8);  // 20% of 40
  const std::set<int64_t> held(split.held_out_documents.begin(), split.held_out_documents.end());
  // Every training sample, over two epochs, as the training stream orders them.
  std::vector<std::unique_ptr<data::TokenFile>> train;
  train.push_back(std::move(split.train));
  data::SampleStream stream(std::move(train), {}, seq_len, 99);
  std::vector<int64_t> window(seq_len + 1);
  std::set<int64_t> trained;
  for (int64_t p = 0; p < 2 * stream.num_samples(); ++p) {
    stream.read(p, window.data());
    for (int64_t t : window) trained.insert(t - 1);
  }
  for (int64_t d : held) CHECK(trained.count(d) == 0);
  CHECK(trained.size() == 32);  // every other document is trained on
  // The held-out side is those documents, whole and in file order.
  int64_t expected_tokens = 0;
  for (int64_t d : held) expected_tokens += 10 + d;
  CHECK(split.held_out->size() == expected_tokens);
  std::vector<int64_t> seen;
  for (int64_t i = 0; i < split.held_out->size(); ++i)
    if (seen.empty() || seen.back() != split.held_out->at(i) - 1) seen.push_back(split.held_out->at(i) - 1);
  CHECK(seen == split.held_out_documents);
  // The same seed holds out the same documents; another seed others; a count is a count.
  auto again = data::split_documents(data::open_token_file(prefix, config::DataFormat::kMegatron, seq_len), -1, 0.2, 7, seq_len);
  CHECK(again.held_out_documents == split.held_out_documents);
  auto other = data::split_documents(data::open_token_file(prefix, config::DataFormat::kMegatron, seq_len), -1, 0.2, 8, seq_len);
  CHECK(other.held_out_documents != split.held_out_documents);
  CHECK(data::split_documents(data::open_token_file(prefix, config::DataFormat::kMegatron, seq_len), -1, 3, 7, seq_len)
            .held_out_documents.size() == 3);
  // Too much held out, or nothing left to train on: a data error naming the file.
  CHECK_THROWS_WITH(data::split_documents(data::open_token_file(prefix, config::DataFormat::kMegatron, seq_len), -1, 40, 7, seq_len),
                    Catch::Contains("docs") && Catch::Contains("leaves none to train on"));
}

TEST_CASE("eval.split on a token stream cuts documents after the end-of-document token", "[data]") {
  test::TempDir tmp;
  std::vector<int64_t> tokens;
  for (int64_t d = 0; d < 12; ++d) {
    tokens.insert(tokens.end(), static_cast<size_t>(20 + d), d + 1);
    tokens.push_back(100);  // end of document
  }
  data::write_llmc(tmp.path() + "/stream.bin", tokens, 7);
  auto file = data::open_token_file(tmp.path() + "/stream.bin", config::DataFormat::kLlmc, 8);
  CHECK(data::document_boundaries(*file, 100).size() == 13);
  CHECK(data::document_boundaries(*file, -1).empty());
  auto split = data::split_documents(std::move(file), 100, 0.25, 1, 8);
  CHECK(split.held_out_documents.size() == 3);
  for (int64_t i = 0; i < split.train->size(); ++i) {
    const int64_t t = split.train->at(i);
    if (t != 100) CHECK(std::count(split.held_out_documents.begin(), split.held_out_documents.end(), t - 1) == 0);
  }
  CHECK_THROWS_WITH(data::split_documents(data::open_token_file(tmp.path() + "/stream.bin", config::DataFormat::kLlmc, 8), -1, 0.25, 1, 8),
                    Catch::Contains("marks none"));
}

TEST_CASE("evaluation sets are fixed windows of their files, named by stem or eval.names", "[train]") {
  test::TempDir tmp;
  std::vector<int64_t> tokens(100);
  for (int64_t i = 0; i < 100; ++i) tokens[static_cast<size_t>(i)] = i;
  data::write_llmc(tmp.path() + "/held.bin", tokens, 7);
  data::WindowOptions options;
  options.vocab_size = 41;
  auto sets = data::open_eval_files({tmp.path() + "/held.bin"}, {}, config::DataFormat::kLlmc, 10, options);
  REQUIRE(sets.size() == 1);
  CHECK(sets[0].name() == "held");
  CHECK(sets[0].samples() == 9);  // (100 - 1) / 10
  auto& windows = dynamic_cast<data::HeldOutWindows&>(sets[0].source());
  std::vector<int64_t> w(11);
  windows.read(3, w.data());
  CHECK(w.front() == 30);
  CHECK(w.back() == 40);
  CHECK_THROWS_WITH(windows.read(4, w.data()), Catch::Contains("outside the model's vocabulary"));
  const data::Batch b = sets[0].batch(0, 3, 2);  // a row past `end`: its shape, nothing trained
  CHECK(b.rows() == 3);
  CHECK(b.trained_targets == 2 * 10);
  CHECK(data::open_eval_files({tmp.path() + "/held.bin"}, {"val"}, config::DataFormat::kLlmc, 10)[0].name() == "val");
  CHECK_THROWS_WITH(data::open_eval_files({tmp.path() + "/held.bin", tmp.path() + "/held.bin"}, {}, config::DataFormat::kLlmc, 10),
                    Catch::Contains("two evaluation sets are named 'held'"));
}

TEST_CASE("the best validation loss and early stopping: HF's rule, checkpointed", "[train]") {
  config::Recipe r;
  r.eval.paths = {"val.bin"};
  r.eval.early_stopping_patience = 2;
  r.eval.early_stopping_min_delta = 0.1;
  train::EvalTracker t(r);
  CHECK(t.record(5, 3.0).improved);
  CHECK(t.record(10, 2.5).improved);
  const auto small = t.record(15, 2.45);  // better, but not by more than min_delta
  CHECK_FALSE(small.improved);
  CHECK_FALSE(small.stop);
  CHECK(t.best_step() == 10);
  // The state round-trips: a resumed tracker stops where this one does.
  train::EvalTracker resumed(r);
  resumed.load_state(t.state());
  CHECK(resumed.best() == 2.5);
  CHECK(resumed.best_step() == 10);
  CHECK(resumed.since_best() == 1);
  CHECK(t.record(20, 2.6).stop);
  CHECK(resumed.record(20, 2.6).stop);
  CHECK(resumed.stopped());
  CHECK_FALSE(train::EvalTracker(r).record(5, std::nan("")).improved);  // NaN never improves
  config::Recipe off;
  CHECK(train::EvalTracker(off).state().empty());  // nothing saved without evaluation
  CHECK(train::EvalTracker(off).state_optional());
}

TEST_CASE("sum_in_rank_order: every rank gets the same double sum, counts past float32 exact", "[comm]") {
  std::mutex m;
  std::vector<std::vector<double>> got(3);
  comm::run_on_threads(3, [&](comm::Communicator& c) {
    const double loss = 1234.5678901234 + 0.1 * c.rank(), count = static_cast<double>((int64_t{1} << 40) + c.rank());
    const auto sums = comm::sum_in_rank_order(c, {loss, count});
    std::lock_guard<std::mutex> lock(m);
    got[static_cast<size_t>(c.rank())] = sums;
  });
  for (const auto& g : got) CHECK(g == got[0]);
  CHECK(got[0][0] == Approx(3 * 1234.5678901234 + 0.3).epsilon(1e-13));
  CHECK(got[0][1] == static_cast<double>(3 * (int64_t{1} << 40) + 3));
}

TEST_CASE("an evaluation's metrics row: its own keys, no loss", "[metrics]") {
  metrics::EvalMetrics m;
  m.step = 20, m.wall_time = 1.5, m.name = "held\"out", m.val_loss = 2.5, m.val_ppl = std::exp(2.5), m.val_tokens = 4096, m.eval_ms = 12.25;
  const std::string line = metrics::jsonl_line(m);
  CHECK(
      line ==
      "{\"step\":20,\"time\":1.500,\"eval\":\"held\\\"out\",\"val_loss\":2.5,\"val_ppl\":12.182494,\"val_tokens\":4096,\"eval_ms\":12.25}");
  CHECK(line.find("\"loss\"") == std::string::npos);
}

TEST_CASE("a preference set's metrics row: pairs and TRL's metrics, no perplexity or tokens; CSV files for names with slashes",
          "[metrics]") {
  metrics::EvalMetrics m;
  m.step = 6, m.wall_time = 2, m.name = "heldout", m.val_loss = 0.5, m.val_ppl = metrics::kNone, m.val_tokens = 0, m.eval_ms = 3;
  m.pairs = 8, m.metrics = {{"rewards/accuracies", 0.625}, {"rewards/margins", -0.25}};
  CHECK(metrics::jsonl_line(m) ==
        "{\"step\":6,\"time\":2.000,\"eval\":\"heldout\",\"val_loss\":0.5,\"val_ppl\":null,\"val_tokens\":null,\"pairs\":8,"
        "\"rewards/accuracies\":0.625,\"rewards/margins\":-0.25,\"eval_ms\":3}");
  test::TempDir dir;
  {
    metrics::SinkOptions o;
    o.csv_dir = dir.path();
    metrics::MetricSinks sinks(o);
    sinks.write(m);
    metrics::StepMetrics step;
    step.step = 6, step.loss = 0.4, step.objective = {{"rewards/chosen", {0.125}}};
    sinks.write(step);
  }
  CHECK(read_file(dir.path() + "/val_heldout_rewards_accuracies.csv") == "step,val_heldout_rewards/accuracies\n6,0.625\n");
  CHECK(read_file(dir.path() + "/rewards_chosen.csv") == "step,rewards/chosen\n6,0.125\n");
  CHECK(!std::filesystem::exists(dir.path() + "/val_heldout_ppl.csv"));
}

TEST_CASE("keep_best: the best step's checkpoint outlives keep_last and ckpt/best names it", "[ckpt]") {
  test::TempDir tmp;
  const std::vector<float> w(4, 1.0f);
  auto save = [&](int64_t step, int64_t best) {
    ckpt::TrainState s;
    s.step = step, s.world_size = 1;
    ckpt::save_checkpoint(tmp.path(), s, {{"w", "float32", {4}, w.data(), w.size() * sizeof(float)}}, ckpt::Retention{1, 0, best});
  };
  save(5, 5);
  save(10, 5);
  save(15, 5);
  CHECK(fs::exists(tmp.path() + "/step_00000005"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step_00000010"));
  CHECK(*ckpt::best_checkpoint(tmp.path()) == (fs::path(tmp.path()) / "step_00000005").string());
  save(20, 20);  // a new best: the old one is pruned like any other
  CHECK_FALSE(fs::exists(tmp.path() + "/step_00000005"));
  CHECK(*ckpt::best_checkpoint(tmp.path()) == (fs::path(tmp.path()) / "step_00000020").string());
  save(25, 20);
  CHECK(fs::exists(tmp.path() + "/step_00000020"));
  CHECK(fs::exists(tmp.path() + "/step_00000025"));
}
