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
#include <cstdint>
#include <memory>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/packing.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::data {
class BlendOrder;
class GlobalSampler;
}  // namespace dstrain::data

namespace dstrain::train {

// Whether the recipe's data are fine-tuning sets (every source has a loss mask; the config
// refuses a blend of conversations and text).
bool is_fine_tuning_data(const config::Recipe& recipe);

// The sources opened and checked (data::open_masked_tokens) and the split.
struct FineTuningSources {
  std::vector<data::MaskedTokens> sources;
  std::vector<std::vector<int64_t>> training;   // per source: the documents training reads, ascending
  std::vector<data::ConversationRef> held_out;  // eval.split's, source by source, ascending
};
FineTuningSources open_fine_tuning_sources(const config::Recipe& recipe);

class PackedConversations {
 public:
  // rank 0 logs each source's conversations, tokens and packing efficiency.
  PackedConversations(const config::Recipe& recipe, FineTuningSources sources, int rank);
  ~PackedConversations();
  int64_t rows() const { return total_rows_; }  // every source's, one pass
  // Global positions [first, first + count) as one micro-batch (the prefetch thread's: not const).
  data::Batch batch(int64_t first, int64_t count);

 private:
  int64_t seq_len_, pad_;
  std::unique_ptr<data::ConversationSet> conversations_;
  std::vector<std::vector<data::PackedRow>> rows_;  // per source, documents index conversations_
  std::vector<data::GlobalSampler> orders_;         // per source: its rows, a permutation per pass
  std::unique_ptr<data::BlendOrder> blend_;
  int64_t total_rows_ = 0;
};

// The rows the recipe's fine-tuning sets pack into (split, packing, seed as PackedConversations
// does), from their indexes alone; -1 when the data are not fine-tuning sets, 0 when a source is
// missing (the config reports it). Throws Error{kData} when a set cannot be read, eval.split
// leaves nothing to train on, or a conversation is longer than a row. (config::LoadOptions'
// packed_rows: train.epochs.)
int64_t packed_rows_of(const config::Recipe& recipe);

// The conversations of an evaluation set packed greedily in their order (the loss does not depend
// on how they are packed, beyond rounding, and order-preserving packing keeps the rows fixed).
std::vector<data::PackedRow> pack_in_order(const data::ConversationSet& conversations, int64_t seq_len);

}  // namespace dstrain::train
