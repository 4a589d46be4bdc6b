#pragma once
// A fine-tuning run's conversations (data.path, or data.paths blended by data.weights, are
// prepare-data --chat sets: a loss mask beside each):
//   eval.split holds out whole conversations of each source (a seeded choice of its own, as for
//   text): they are the evaluation set "heldout" and training never reads them;
//   each source's other conversations are packed once into rows (data.packing), in a seeded order
//   (not the file's: a set sorted by topic or length would pack alike conversations together);
//   global position p is a row: its source by the blend (data::BlendOrder over data.weights, or
//   over the sources' row counts, so that a pass of all rows takes each source's rows once), that
//   source's next row in a seeded permutation of its rows per pass over them.
// The order depends on the seed alone, never on the world size, so a resume on any number of
// ranks continues it. One source with no split packs and orders exactly as before blends existed.
// An evaluation set of conversations is ConversationsInOrder: packed greedily in file order.
#include <cstdint>
#include <memory>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/data/batch_source.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/packing.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::data {

class BlendOrder;
class GlobalSampler;

// Whether the recipe's data are fine-tuning sets (every source has a loss mask; the config
// refuses a blend of conversations and text).
bool is_fine_tuning_data(const config::Recipe& recipe);

// The sources opened and checked (data::open_masked_tokens) and the split.
struct FineTuningSources {
  std::vector<MaskedTokens> sources;
  std::vector<std::vector<int64_t>> training;  // per source: the documents training reads, ascending
  std::vector<ConversationRef> held_out;       // eval.split's, source by source, ascending
};
FineTuningSources open_fine_tuning_sources(const config::Recipe& recipe);

class PackedConversations final : public BatchSource {
 public:
  // rank 0 logs each source's conversations, tokens and packing efficiency.
  PackedConversations(const config::Recipe& recipe, FineTuningSources sources, int rank);
  ~PackedConversations() override;
  int64_t rows() const override { return total_rows_; }  // every source's, one pass
  // Global positions [first, first + count) as one micro-batch.
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  std::string describe() const override;
  bool conversations() const override { return true; }

 private:
  int64_t seq_len_, pad_;
  std::unique_ptr<ConversationSet> conversations_;
  std::vector<std::vector<PackedRow>> rows_;  // per source, documents index conversations_
  std::vector<GlobalSampler> orders_;         // per source: its rows, a permutation per pass
  std::unique_ptr<BlendOrder> blend_;
  int64_t total_rows_ = 0;
};

class ConversationsInOrder final : public BatchSource {
 public:
  // `pad` fills the rows. Throws Error{kData} naming the set for a conversation longer than a
  // row, or when there is none.
  ConversationsInOrder(std::string name, ConversationSet conversations, int64_t seq_len, int64_t pad);
  ~ConversationsInOrder() override;
  int64_t rows() const override { return static_cast<int64_t>(rows_.size()); }
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  std::string describe() const override;
  int64_t conversations_in(int64_t rows) const override;
  bool conversations() const override { return true; }

 private:
  std::string name_;
  std::unique_ptr<ConversationSet> conversations_;
  std::vector<PackedRow> rows_;
  int64_t seq_len_, pad_;
};

// The rows the recipe's fine-tuning sets pack into (split, packing, seed as PackedConversations
// does), from their indexes alone; -1 when the data are not fine-tuning sets, 0 when a source is
// missing (the config reports it). Throws Error{kData} when a set cannot be read, eval.split
// leaves nothing to train on, or a conversation is longer than a row. (config::LoadOptions'
// packed_rows: train.epochs.)
int64_t packed_rows_of(const config::Recipe& recipe);

// The conversations of an evaluation set packed greedily in their order (the loss does not depend
// on how they are packed, beyond rounding, and order-preserving packing keeps the rows fixed).
std::vector<PackedRow> pack_in_order(const ConversationSet& conversations, int64_t seq_len);

}  // namespace dstrain::data
