#pragma once
// The token sources a run reads: training (the training side of eval.split, when it holds out
// documents) and evaluation (eval.paths, and the held-out documents as the set "heldout").
// An evaluation set is a fixed list of samples, read the same way at every evaluation:
//   text           windows: window w is tokens [w * T, w * T + T + 1) of its files taken one
//                  after another, every target trained;
//   conversations  a fine-tuning set's (eval.paths with a loss mask beside them, or the
//                  conversations eval.split holds out of fine-tuning sets): packed greedily in
//                  file order into rows of T, trained where the loss mask trains, attention and
//                  positions within each conversation, as training reads them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/batch.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/packing.h"
#include "dstrain/data/token_file.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::train {

struct FineTuningSources;

// How a text set's windows become a batch (data.eos_token, data.document_mask,
// data.reset_positions) and the vocabulary every token is checked against (0: unchecked).
struct WindowOptions {
  int64_t eos_token = -1;
  bool document_mask = false, reset_positions = false;
  int64_t vocab_size = 0;
};

class EvalSet {
 public:
  // Text: the windows of `files`.
  EvalSet(std::string name, std::vector<std::unique_ptr<data::TokenFile>> files, int64_t seq_len);
  // Conversations, packed in order; `pad` fills the rows. Throws Error{kData} naming a
  // conversation longer than a row, or when there is none.
  EvalSet(std::string name, data::ConversationSet conversations, int64_t seq_len, int64_t pad);
  EvalSet(EvalSet&&) noexcept;
  EvalSet& operator=(EvalSet&&) noexcept;
  ~EvalSet();

  const std::string& name() const { return name_; }
  int64_t samples() const;  // windows, or packed rows
  int64_t seq_len() const { return seq_len_; }
  bool conversations() const { return conversations_ != nullptr; }
  // For the start-up log: what the set holds.
  std::string describe() const;
  // The conversations in the first `samples` packed rows (0 for text).
  int64_t conversations_in(int64_t samples) const;
  // Samples [first, first + count) as one micro-batch of `count` rows; rows from `end` (at most
  // samples()) on have the same shape and train nothing. Throws Error{kData} naming the file of a
  // token outside the vocabulary (text; a fine-tuning set's tokens are checked when it opens).
  data::Batch batch(int64_t first, int64_t count, int64_t end, const WindowOptions& options) const;
  // Text window `w`: seq_len + 1 tokens into out (checked against [0, vocab_size) when vocab_size > 0).
  void read(int64_t w, int64_t* out, int64_t vocab_size) const;

 private:
  std::string name_;
  int64_t seq_len_;
  std::vector<std::unique_ptr<data::TokenFile>> files_;
  std::vector<int64_t> window_starts_;  // each file's first window (plus the total)
  std::unique_ptr<data::ConversationSet> conversations_;
  std::vector<data::PackedRow> rows_;
  int64_t pad_ = 0;
};

// What training reads: text files (the training side of eval.split) in the recipe's blend, or
// fine-tuning sets.
struct TrainingSources {
  std::vector<std::unique_ptr<data::TokenFile>> files;
  std::unique_ptr<FineTuningSources> fine_tuning;
  TrainingSources();
  TrainingSources(TrainingSources&&) noexcept;
  TrainingSources& operator=(TrainingSources&&) noexcept;
  ~TrainingSources();
};

struct DataSources {
  TrainingSources train;
  std::vector<EvalSet> eval;
};

// The recipe's data (data.path / data.paths, split by eval.split) and, with `with_eval`, its
// evaluation sets in the order eval.names gives them names (eval.paths, then the split).
// Throws Error{kData} naming the file (missing, malformed, no window) or Error{kConfig} (names).
DataSources open_data_sources(const config::Recipe& recipe, bool with_eval);

// The recipe's evaluation sets alone (dstrain eval): the training data is opened only for eval.split.
std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe);

// Evaluation sets from files: each named by names[i], else its file's stem. A Megatron set with
// a loss mask beside it is a set of conversations (tokens checked against vocab_size, rows padded
// with `pad`).
std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len, int64_t vocab_size = 0, int64_t pad = 0);

}  // namespace dstrain::train
