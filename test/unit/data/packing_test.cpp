// data/packing.h: conversations packed whole into rows (none, greedy, best-fit decreasing), and a
// packed row's batch: labels only where the mask trains and never across a conversation's end,
// positions from 0 in each, attention within each, padding its own document. The loss of a packed
// batch equals the token-weighted combination of its conversations' separate losses (dense, MLA).
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <filesystem>

#include <unistd.h>

#include "dstrain/core/error.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/packing.h"
#include "dstrain/data/token_file.h"
#include "data/fine_tuning_set.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/objective.h"
#include "model/tiny_models.h"

using namespace dstrain;
namespace fs = std::filesystem;

namespace {

std::vector<int64_t> rows_of(const std::vector<data::PackedRow>& rows) {
  std::vector<int64_t> out;
  for (const auto& r : rows) out.push_back(r.tokens);
  return out;
}

// A Megatron dataset of conversations with their loss mask, in a scratch folder.
struct Conversations {
  std::string prefix;
  std::vector<std::vector<int64_t>> docs;
  std::vector<std::vector<uint8_t>> masks;
  std::shared_ptr<data::TokenFile> file;
  std::shared_ptr<data::LossMask> mask;

  Conversations(const std::vector<int64_t>& lengths, int64_t vocab) {
    const fs::path dir = fs::temp_directory_path() / ("dstrain-packing-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    prefix = (dir / "sft").string();
    at::manual_seed(5);
    data::LossMaskWriter writer(prefix);
    for (const int64_t n : lengths) {
      const at::Tensor t = at::randint(0, vocab, {n}, at::kLong);
      docs.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
      std::vector<uint8_t> m(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) m[static_cast<size_t>(i)] = i >= n / 2 ? 1 : 0;  // a prompt, then the answer
      writer.add(m.data(), m.size());
      masks.push_back(m);
    }
    data::write_megatron(prefix, docs);
    writer.finish();
    test::describe_fine_tuning_set(prefix, vocab, writer);
    file = data::open_token_file(prefix, config::DataFormat::kMegatron, 1);
    mask = std::make_shared<data::LossMask>(prefix, file->size());
  }
  data::ConversationSet set() const { return data::ConversationSet::all_of({{file, mask}}); }
  ~Conversations() { fs::remove_all(fs::path(prefix).parent_path()); }
};

}  // namespace

TEST_CASE("packing: whole conversations, in order or best-fit decreasing", "[data][packing]") {
  const std::vector<int64_t> lengths{5, 9, 3, 7, 2, 8};
  const std::vector<int64_t> order{0, 1, 2, 3, 4, 5};
  CHECK(rows_of(data::pack_documents(lengths, order, 10, data::Packing::kNone)) == std::vector<int64_t>{5, 9, 3, 7, 2, 8});
  const auto greedy = data::pack_documents(lengths, order, 10, data::Packing::kGreedy);
  CHECK(rows_of(greedy) == std::vector<int64_t>{5, 9, 10, 10});
  CHECK(greedy[2].documents == std::vector<int64_t>{2, 3});
  const auto best = data::pack_documents(lengths, order, 10, data::Packing::kBestFit);
  CHECK(rows_of(best) == std::vector<int64_t>{9, 10, 10, 5});  // 9, 8+2, 7+3, 5
  CHECK(best[0].documents == std::vector<int64_t>{1});
  CHECK(data::packing_efficiency(best, 10) == Approx(34.0 / 40.0));
  CHECK_THROWS_WITH(data::pack_documents({4, 12}, {0, 1}, 10, data::Packing::kGreedy),
                    Catch::Contains("conversation 1 has 12 tokens, more than a row of data.seq_len 10 holds"));
}

TEST_CASE("packing: a packed row's labels, positions, documents and padding", "[data][packing]") {
  const Conversations c({4, 3, 5}, 50);
  const auto rows = data::pack_documents({4, 3, 5}, {0, 1, 2}, 8, data::Packing::kGreedy);
  REQUIRE(rows.size() == 2);  // [0, 1] and [2]
  const data::Batch b = data::packed_batch({&rows[0], &rows[1]}, c.set(), 8, 0);
  const auto at = [](const at::Tensor& t, int64_t r, int64_t i) { return t[r][i].item<int64_t>(); };
  for (int64_t i = 0; i < 4; ++i) CHECK(at(b.tokens, 0, i) == c.docs[0][static_cast<size_t>(i)]);
  for (int64_t i = 0; i < 3; ++i) CHECK(at(b.tokens, 0, 4 + i) == c.docs[1][static_cast<size_t>(i)]);
  CHECK(at(b.tokens, 0, 7) == 0);  // padding
  const std::vector<int64_t> positions{0, 1, 2, 3, 0, 1, 2, 0}, ids{0, 0, 0, 0, 1, 1, 1, 2};
  for (int64_t i = 0; i < 8; ++i) CHECK(at(b.positions, 0, i) == positions[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < 8; ++i) CHECK(at(b.document_ids, 0, i) == ids[static_cast<size_t>(i)]);
  CHECK(b.document_lengths[0] == std::vector<int64_t>{4, 3, 1});
  CHECK(b.document_lengths[1] == std::vector<int64_t>{5, 3});
  // Conversation 0 (mask 0 0 1 1): position 0 predicts a prompt token (not trained), 1 and 2 the
  // answer; its last token predicts nothing (the next conversation is not its continuation).
  CHECK(at(b.labels, 0, 0) == data::kIgnoreIndex);
  CHECK(at(b.labels, 0, 1) == c.docs[0][2]);
  CHECK(at(b.labels, 0, 2) == c.docs[0][3]);
  CHECK(at(b.labels, 0, 3) == data::kIgnoreIndex);
  CHECK(at(b.labels, 0, 6) == data::kIgnoreIndex);
  CHECK(at(b.labels, 0, 7) == data::kIgnoreIndex);
  CHECK(b.trained_targets == b.labels.ne(data::kIgnoreIndex).sum().item<int64_t>());
}

namespace {

// The packed batch's summed loss against each conversation's own, alone in a batch.
void check_packed_loss(const config::ModelConfig& cfg) {
  const std::vector<int64_t> lengths{6, 3, 9, 4, 12, 5, 7};
  const Conversations c(lengths, cfg.vocab_size);
  const c10::NoGradGuard no_grad;
  const auto m = model::make_model(cfg, 11);
  const model::Objective loss_of;
  std::vector<int64_t> order(lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  const auto rows = data::pack_documents(lengths, order, cfg.max_seq_len, data::Packing::kBestFit);
  std::vector<const data::PackedRow*> all;
  for (const auto& r : rows) all.push_back(&r);
  const data::Batch packed = data::packed_batch(all, c.set(), cfg.max_seq_len, 1);
  const model::ObjectiveValue p = loss_of(*m, packed);
  double separate = 0;
  int64_t count = 0;
  for (size_t d = 0; d < c.docs.size(); ++d) {
    const int64_t n = lengths[d];
    const at::Tensor tokens = at::tensor(c.docs[d], at::kLong).view({1, n});
    at::Tensor labels = at::full({1, n}, data::kIgnoreIndex, at::kLong);
    for (int64_t i = 0; i + 1 < n; ++i)
      if (c.masks[d][static_cast<size_t>(i + 1)]) labels[0][i] = c.docs[d][static_cast<size_t>(i + 1)];
    const model::ObjectiveValue one = loss_of(*m, data::labelled_batch(tokens, labels));
    separate += one.sum.item<double>();
    count += one.count;
  }
  CHECK(p.count == count);
  const double packed_mean = p.sum.item<double>() / static_cast<double>(p.count), separate_mean = separate / static_cast<double>(count);
  CHECK(std::abs(packed_mean - separate_mean) <= 1e-6);
}

}  // namespace

TEST_CASE("packing: a packed batch's loss is the token-weighted loss of its conversations (dense)", "[data][packing]") {
  config::ModelConfig cfg;
  cfg.vocab_size = 61, cfg.hidden_size = 32, cfg.num_layers = 2, cfg.num_heads = 4, cfg.num_kv_heads = 2, cfg.intermediate_size = 48;
  cfg.max_seq_len = 16;
  check_packed_loss(cfg);
}

TEST_CASE("packing: a packed batch's loss is the token-weighted loss of its conversations (MLA + MoE)", "[data][packing]") {
  check_packed_loss(test::tiny_v3());
}
