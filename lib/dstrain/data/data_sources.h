#pragma once
// The sources a run reads (data/batch_source.h): training's (the training side of eval.split,
// when it holds out documents or conversations) and evaluation's (eval.paths, and the held-out
// part as the set "heldout"). An evaluation set is a fixed list of rows, read the same way at
// every evaluation:
//   text           HeldOutWindows: window w is tokens [w * T, w * T + T + 1) of its files taken
//                  one after another, every target trained;
//   conversations  ConversationsInOrder: a fine-tuning set's (eval.paths with a loss mask beside
//                  them, or the conversations eval.split holds out of fine-tuning sets) packed
//                  greedily in file order into rows of T, trained where the loss mask trains,
//                  attention and positions within each conversation, as training reads them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/batch_source.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::data {

class PreferencePairs;

// A named evaluation set.
class EvalSet {
 public:
  EvalSet(std::string name, std::unique_ptr<BatchSource> source);
  EvalSet(EvalSet&&) noexcept;
  EvalSet& operator=(EvalSet&&) noexcept;
  ~EvalSet();
  const std::string& name() const { return name_; }
  int64_t samples() const { return source_->rows(); }  // windows, or packed rows
  bool conversations() const { return source_->conversations(); }
  bool pairs() const { return source_->pairs(); }  // preference pairs: samples() counts pairs
  std::string describe() const { return source_->describe(); }
  // The conversations in the first `samples` packed rows (0 for text).
  int64_t conversations_in(int64_t samples) const { return source_->conversations_in(samples); }
  // Rows [first, first + count) as one micro-batch; rows from `end` (at most samples()) on have
  // the same shape and train nothing.
  Batch batch(int64_t first, int64_t count, int64_t end) const { return source_->batch(first, count, end); }
  BatchSource& source() const { return *source_; }

 private:
  std::string name_;
  std::unique_ptr<BatchSource> source_;
};

struct DataSources {
  std::unique_ptr<BatchSource> train;  // in the recipe's blend: TextWindows or PackedConversations; PreferencePairs (dpo, reward)
  std::vector<EvalSet> eval;
  // train.objective dpo: the sets of pairs whose reference log-probs the run makes or reads before
  // its first batch (owned by `train` and `eval`: training's first, then each of eval.paths; the
  // pairs eval.split holds out read training's table). Empty otherwise (a reward model has no reference).
  std::vector<const PreferencePairs*> preference;
};

// The recipe's window options (data.eos_token when masks or positions use it, the vocabulary).
WindowOptions window_options(const config::Recipe& recipe);

// The recipe's data (data.path / data.paths, split by eval.split) and, with `with_eval`, its
// evaluation sets in the order eval.names gives them names (eval.paths, then the split). `rank` 0
// logs what a fine-tuning set packs into. Throws Error{kData} naming the file (missing,
// malformed, no window) or Error{kConfig} (names).
DataSources open_data_sources(const config::Recipe& recipe, bool with_eval, int rank = 0);

// The recipe's evaluation sets alone (dstrain eval): the training data is opened only for eval.split.
std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe);

// train.objective dpo: each of eval.paths as a set of preference pairs (file order), named as
// open_eval_files names them.
std::vector<EvalSet> open_eval_pairs(const config::Recipe& recipe);

// Evaluation sets from files: each named by names[i], else its file's stem. A Megatron set with
// a loss mask beside it is a set of conversations (tokens checked against the options'
// vocabulary, rows padded with `pad`).
std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len, const WindowOptions& options = {}, int64_t pad = 0);

}  // namespace dstrain::data
