#pragma once
// Fine-tuning samples: whole conversations (the documents of a loss-masked dataset) packed into
// rows of seq_len tokens, never split, and the batch a row gives: labels only where the mask
// trains and never across a conversation's end, attention within each conversation, RoPE
// positions from 0 in each, and padding that is its own masked document.
//   none      one conversation per row, padded
//   greedy    in the given order, a new row when the next conversation does not fit
//   best_fit  longest first, each into the fullest row it fits (best-fit decreasing)
#include <cstdint>
#include <vector>

#include "dstrain/data/batch.h"

namespace dstrain::data {

class ConversationSet;

enum class Packing { kNone, kGreedy, kBestFit };

struct PackedRow {
  std::vector<int64_t> documents;  // indices into the packed lengths (a ConversationSet's conversations), in row order
  int64_t tokens = 0;
};

// Packs documents of `lengths` (in `order`: indices into lengths) into rows of at most
// `capacity` tokens. Throws Error{kData} naming the first document longer than a row.
std::vector<PackedRow> pack_documents(const std::vector<int64_t>& lengths, const std::vector<int64_t>& order, int64_t capacity,
                                      Packing packing);

// The share of row tokens that hold a conversation (1: no padding).
double packing_efficiency(const std::vector<PackedRow>& rows, int64_t capacity);

// The batch of `rows` of `conversations`: int64 [rows, seq_len]. Position t's label is token t + 1
// when it belongs to the same conversation and the mask trains it, else kIgnoreIndex; `pad` fills
// the rest of a row (an empty row is all padding: nothing trained).
Batch packed_batch(const std::vector<const PackedRow*>& rows, const ConversationSet& conversations, int64_t seq_len, int64_t pad);

}  // namespace dstrain::data
