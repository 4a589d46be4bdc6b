#include "dstrain/data/packing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dstrain/core/error.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {
namespace {

void check_fits(const std::vector<int64_t>& lengths, int64_t document, int64_t capacity) {
  if (lengths[static_cast<size_t>(document)] > capacity)
    throw Error(ErrorCode::kData,
                fmt::format("conversation {} has {} tokens, more than a row of data.seq_len {} holds", document,
                            lengths[static_cast<size_t>(document)], capacity),
                fmt::format("prepare the data with --max-length {} (drop or truncate longer ones), or raise data.seq_len", capacity));
}

std::vector<PackedRow> best_fit(const std::vector<int64_t>& lengths, std::vector<int64_t> order, int64_t capacity) {
  // Longest first; ties keep their order, so the rows depend on the order alone.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)]; });
  std::vector<PackedRow> rows;
  std::multimap<int64_t, size_t> by_room;  // free tokens -> row
  for (const int64_t d : order) {
    check_fits(lengths, d, capacity);
    const int64_t n = lengths[static_cast<size_t>(d)];
    auto it = by_room.lower_bound(n);  // the fullest row that still fits it
    size_t row = rows.size();
    if (it != by_room.end()) {
      row = it->second;
      by_room.erase(it);
    } else {
      rows.emplace_back();
    }
    rows[row].documents.push_back(d);
    rows[row].tokens += n;
    by_room.emplace(capacity - rows[row].tokens, row);
  }
  return rows;
}

}  // namespace

std::vector<PackedRow> pack_documents(const std::vector<int64_t>& lengths, const std::vector<int64_t>& order, int64_t capacity,
                                      Packing packing) {
  if (packing == Packing::kBestFit) return best_fit(lengths, order, capacity);
  std::vector<PackedRow> rows;
  for (const int64_t d : order) {
    check_fits(lengths, d, capacity);
    const int64_t n = lengths[static_cast<size_t>(d)];
    if (rows.empty() || packing == Packing::kNone || rows.back().tokens + n > capacity) rows.emplace_back();
    rows.back().documents.push_back(d);
    rows.back().tokens += n;
  }
  return rows;
}

double packing_efficiency(const std::vector<PackedRow>& rows, int64_t capacity) {
  int64_t used = 0;
  for (const auto& r : rows) used += r.tokens;
  return rows.empty() ? 1.0 : static_cast<double>(used) / static_cast<double>(capacity * static_cast<int64_t>(rows.size()));
}

Batch packed_batch(const std::vector<const PackedRow*>& rows, const ConversationSet& conversations, int64_t seq_len, int64_t pad) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = seq_len;
  Batch b;
  b.tokens = at::full({B, T}, pad, at::kLong);
  b.labels = at::full({B, T}, kIgnoreIndex, at::kLong);
  b.positions = at::empty({B, T}, at::kLong);
  b.document_ids = at::empty({B, T}, at::kLong);
  b.sequential_positions = false;
  int64_t* tokens = b.tokens.data_ptr<int64_t>();
  int64_t* labels = b.labels.data_ptr<int64_t>();
  int64_t* positions = b.positions.data_ptr<int64_t>();
  int64_t* ids = b.document_ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < B; ++r) {
    std::vector<int64_t> lengths;
    int64_t t = r * T;
    for (const int64_t d : rows[static_cast<size_t>(r)]->documents) {
      const ConversationSet::Span c = conversations.span(d);
      for (int64_t i = c.begin; i < c.end; ++i, ++t) {
        tokens[t] = c.tokens->at(i);
        positions[t] = i - c.begin;
        ids[t] = static_cast<int64_t>(lengths.size());
        if (i + 1 < c.end && c.mask->trained(i + 1)) labels[t] = c.tokens->at(i + 1), ++b.trained_targets;
      }
      lengths.push_back(c.end - c.begin);
    }
    const int64_t used = t - r * T;
    for (int64_t p = 0; used + p < T; ++p, ++t) positions[t] = p, ids[t] = static_cast<int64_t>(lengths.size());
    if (used < T) lengths.push_back(T - used);
    b.document_lengths.push_back(std::move(lengths));
  }
  return b;
}

}  // namespace dstrain::data
