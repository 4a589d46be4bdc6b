// Fine-tuning data below the trainer (issue 38): eval.split holds whole conversations out of
// each source and training never reads them; blends of fine-tuning sets draw each source's rows
// in proportion to data.weights (or to its rows), each row once per pass over that source, in an
// order that a jump back (a resume) reproduces; packed_rows_of counts the rows the data plan
// packs; an evaluation set of conversations is packed in order and trains what the mask trains.
#include <ATen/ATen.h>

#include <map>
#include <set>

#include "catch_torch.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/token_file.h"
#include "dstrain/train/data_plan.h"
#include "dstrain/data/data_sources.h"
#include "dstrain/data/fine_tuning.h"
#include "data/fine_tuning_set.h"
#include "test_support.h"

using namespace dstrain;

namespace {
data::WindowOptions vocab(int64_t n) {
  data::WindowOptions o;
  o.vocab_size = n;
  return o;
}
}  // namespace

namespace {

constexpr int64_t kVocab = 4096;

// A fine-tuning set of `n` conversations of 4..11 tokens: every token of conversation d is
// tag + d (so a batch token names its set and conversation), its first half the prompt.
std::string write_set(const std::string& dir, const std::string& name, int64_t n, int64_t tag) {
  const std::string prefix = dir + "/" + name;
  std::vector<std::vector<int64_t>> docs;
  data::LossMaskWriter mask(prefix);
  for (int64_t d = 0; d < n; ++d) {
    const int64_t len = 4 + d % 8;
    docs.emplace_back(static_cast<size_t>(len), tag + d);
    std::vector<uint8_t> m(static_cast<size_t>(len));
    for (int64_t i = len / 2; i < len; ++i) m[static_cast<size_t>(i)] = 1;
    mask.add(m.data(), m.size());
  }
  data::write_megatron(prefix, docs);
  mask.finish();
  test::describe_fine_tuning_set(prefix, kVocab, mask);
  return prefix;
}

config::Recipe recipe_of(std::vector<std::string> paths, std::vector<double> weights = {}) {
  config::Recipe r;
  r.data.format = config::DataFormat::kMegatron;
  if (paths.size() == 1)
    r.data.path = paths[0];
  else
    r.data.paths = std::move(paths);
  r.data.weights = std::move(weights);
  r.data.seq_len = 16;
  r.data.packing = config::Packing::kGreedy;
  r.data.eos_token = 0;
  r.model.vocab_size = kVocab;
  r.train.micro_batch_size = 4;
  r.train.global_batch_size = 4;
  r.seed = 3;
  return r;
}

// The (tag + conversation) values a batch holds, one per conversation in it.
std::multiset<int64_t> conversations_in(const data::Batch& b) {
  std::multiset<int64_t> out;
  const at::Tensor t = b.tokens.contiguous(), ids = b.document_ids.contiguous();
  for (int64_t r = 0; r < b.rows(); ++r)
    for (int64_t i = 0; i < b.length(); ++i) {
      const int64_t tok = t[r][i].item<int64_t>();
      const bool first_of_document = i == 0 || ids[r][i].item<int64_t>() != ids[r][i - 1].item<int64_t>();
      if (tok != 0 && first_of_document) out.insert(tok);
    }
  return out;
}

}  // namespace

TEST_CASE("fine-tuning eval.split: whole conversations held out per source, never trained, the same on every call", "[train]") {
  test::TempDir dir;
  config::Recipe r = recipe_of({write_set(dir.path(), "a", 40, 1000), write_set(dir.path(), "b", 20, 2000)});
  r.eval.split = 0.1;
  const data::FineTuningSources s = data::open_fine_tuning_sources(r);
  REQUIRE(s.held_out.size() == 6);  // 4 of a's 40, 2 of b's 20
  std::set<int64_t> held;
  for (const auto& ref : s.held_out) held.insert((ref.source == 0 ? 1000 : 2000) + ref.document);
  CHECK(s.training[0].size() == 36);
  CHECK(s.training[1].size() == 18);
  // Two passes over every row: no held-out conversation, every other one.
  data::PackedConversations packed(r, data::open_fine_tuning_sources(r), 1);
  CHECK(packed.rows() == data::packed_rows_of(r));
  std::multiset<int64_t> seen;
  for (int64_t p = 0; p < 2 * packed.rows(); p += 4) {
    const auto c = conversations_in(packed.batch(p, std::min<int64_t>(4, 2 * packed.rows() - p)));
    seen.insert(c.begin(), c.end());
  }
  for (int64_t c : held) CHECK(seen.count(c) == 0);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 54);
  for (int64_t c : std::set<int64_t>(seen.begin(), seen.end())) CHECK(seen.count(c) == 2);  // once per pass
  // The held-out side, as the evaluation set "heldout": those conversations, packed in order.
  const data::DataSources sources = data::open_data_sources(r, true);
  REQUIRE(sources.eval.size() == 1);
  const data::EvalSet& e = sources.eval[0];
  CHECK(e.name() == "heldout");
  CHECK(e.conversations());
  CHECK(e.conversations_in(e.samples()) == 6);
  std::multiset<int64_t> evaluated;
  for (int64_t first = 0; first < e.samples(); first += 2) {
    const auto c = conversations_in(e.batch(first, 2, e.samples()));
    evaluated.insert(c.begin(), c.end());
  }
  CHECK(std::set<int64_t>(evaluated.begin(), evaluated.end()) == held);
  // Too large a split is refused by name.
  r.eval.split = 20;
  CHECK_THROWS_WITH(data::open_fine_tuning_sources(r), Catch::Contains("holds out 20 of its 20 conversations"));
}

TEST_CASE("fine-tuning blends: rows drawn by data.weights, each source's rows once per its pass, a jump back reads the same", "[train]") {
  test::TempDir dir;
  const std::string a = write_set(dir.path(), "a", 64, 1000), b = write_set(dir.path(), "b", 64, 2000);
  config::Recipe r = recipe_of({a, b}, {3, 1});
  r.data.packing = config::Packing::kNone;  // a row is a conversation: counts are conversations
  data::PackedConversations packed(r, data::open_fine_tuning_sources(r), 1);
  CHECK(packed.rows() == 128);
  CHECK(data::packed_rows_of(r) == 128);
  std::map<int64_t, int> per_source;
  std::multiset<int64_t> of_a;
  std::vector<std::multiset<int64_t>> batches;
  for (int64_t p = 0; p < 256; p += 4) {
    batches.push_back(conversations_in(packed.batch(p, 4)));
    for (int64_t c : batches.back()) per_source[c / 1000] += 1, c < 2000 ? (void)of_a.insert(c) : (void)0;
  }
  CHECK(per_source[1] == 192);  // 3 : 1
  CHECK(per_source[2] == 64);
  for (int64_t c : std::set<int64_t>(of_a.begin(), of_a.end())) CHECK(of_a.count(c) == 3);  // three passes over a's 64
  for (int64_t p : {200, 16, 0, 252}) CHECK(conversations_in(packed.batch(p, 4)) == batches[static_cast<size_t>(p / 4)]);
  SECTION("without weights each source's share is its rows: one pass reads every row once") {
    const std::string small = write_set(dir.path(), "small", 16, 3000);
    const config::Recipe u = recipe_of({a, small});
    data::PackedConversations unweighted(u, data::open_fine_tuning_sources(u), 1);
    std::multiset<int64_t> pass;
    for (int64_t p = 0; p < unweighted.rows(); ++p) {
      const auto c = conversations_in(unweighted.batch(p, 1));
      pass.insert(c.begin(), c.end());
    }
    CHECK(pass.size() == 80);
    CHECK(std::set<int64_t>(pass.begin(), pass.end()).size() == 80);
  }
  SECTION("a blend of a fine-tuning set and text is refused") {
    std::vector<std::vector<int64_t>> docs{{5, 6, 7, 8, 9}};
    data::write_megatron(dir.path() + "/text", docs);
    const config::Recipe mixed = recipe_of({a, dir.path() + "/text"});
    CHECK_THROWS_WITH(data::is_fine_tuning_data(mixed), Catch::Contains("1 of the 2 sources have a loss mask"));
  }
}

TEST_CASE("fine-tuning: one source without a split reads the rows DataPlan read before blends", "[train]") {
  // The single-source order is seeded as it was (pack order seed ^ "PACK", rows by the data seed):
  // these are the first rows the data plan of earlier versions gave for this set and seed.
  test::TempDir dir;
  const config::Recipe r = recipe_of({write_set(dir.path(), "a", 30, 1000)});
  train::DataPlan plan(r, 0, 1);
  CHECK(plan.fine_tuning());
  CHECK(plan.num_samples() == data::packed_rows_of(r));
  plan.prefetch(0, 0, {});
  const std::vector<data::Batch> batches = plan.take();
  REQUIRE(batches.size() == 1);
  CHECK(batches[0].trained_targets == batches[0].labels.ne(data::kIgnoreIndex).sum().item<int64_t>());
}

TEST_CASE("an evaluation set of conversations: rows in file order, past the end nothing trained, only masked targets", "[train]") {
  test::TempDir dir;
  const std::string a = write_set(dir.path(), "a", 10, 1000);
  auto sets = data::open_eval_files({a}, {}, config::DataFormat::kMegatron, 16, vocab(kVocab), 0);
  REQUIRE(sets.size() == 1);
  const data::EvalSet& e = sets[0];
  CHECK(e.name() == "a");
  CHECK(e.conversations());
  // Lengths 4..11 then 4, 5: greedy in order into rows of 16.
  CHECK(e.samples() == 6);  // [4 5 6] [7 8] [9] [10] [11 4] [5]
  CHECK(e.conversations_in(2) == 5);
  const data::Batch b = e.batch(4, 3, e.samples());
  CHECK(b.rows() == 3);
  CHECK(b.labels[2].ne(data::kIgnoreIndex).sum().item<int64_t>() == 0);  // a row past the end
  // Rows 4 and 5 hold conversations 7 (11 tokens, 5 of them prompt), 8 (4, 2) and 9 (5, 2): every
  // answer token is a target, predicted from the token before it.
  CHECK(b.trained_targets == 6 + 2 + 3);
  CHECK(e.batch(4, 3, 5).trained_targets == 6 + 2);  // `end`: max_batches stops at row 5
  CHECK_THROWS_WITH(data::open_eval_files({a}, {}, config::DataFormat::kMegatron, 8, vocab(kVocab), 0),
                    Catch::Contains("more than a row of data.seq_len 8 holds"));
  CHECK_THROWS_WITH(data::open_eval_files({a}, {}, config::DataFormat::kMegatron, 16, vocab(1000), 0),
                    Catch::Contains("outside model.vocab_size"));
}
