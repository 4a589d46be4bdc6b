#pragma once
// Where micro-batches come from, whatever the data: a source has rows (samples of seq_len
// targets) and gives rows first..first + count as one data::Batch. Training reads positions of an
// endless seeded order (DataPlan deals them to ranks); evaluation reads rows 0..rows() - 1 and
// pads a last micro-batch with rows that train nothing (`end`). The kinds, one class each:
//   TextWindows            pretraining windows of token files in the recipe's blend (text_windows.h)
//   HeldOutWindows         an evaluation set's consecutive windows of its files (text_windows.h)
//   PackedConversations    fine-tuning sets packed per source and blended (fine_tuning.h)
//   ConversationsInOrder   an evaluation set's conversations packed in file order (fine_tuning.h)
#include <cstdint>
#include <limits>
#include <string>

#include "dstrain/data/batch.h"

namespace dstrain::data {

// How text windows become a batch (data.eos_token, data.document_mask, data.reset_positions) and
// the vocabulary every token is checked against (0: unchecked).
struct WindowOptions {
  int64_t eos_token = -1;
  bool document_mask = false, reset_positions = false;
  int64_t vocab_size = 0;
};

class BatchSource {
 public:
  static constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();
  virtual ~BatchSource() = default;
  // Rows in one pass over the source.
  virtual int64_t rows() const = 0;
  // Rows [first, first + count) as one micro-batch of `count` rows; those from `end` on have the
  // same shape and train nothing. Throws Error{kData} naming the file of a bad token. Not const:
  // a source may read ahead (it runs on the prefetch thread).
  virtual Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) = 0;
  // For the start-up log: what the source holds.
  virtual std::string describe() const = 0;
  // Conversations in the first `rows` rows (0: text).
  virtual int64_t conversations_in(int64_t rows) const { return 0; }
  virtual bool conversations() const { return false; }
  // Preference pairs (data/preference_pairs.h): a row is a pair's chosen or rejected sequence, rows() counts pairs.
  virtual bool pairs() const { return false; }
  // The chosen completions' trained targets of the first `count` pairs in evaluation order (0: not pairs).
  virtual int64_t chosen_targets_in(int64_t count) const { return 0; }
};

}  // namespace dstrain::data
