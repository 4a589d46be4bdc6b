#pragma once
// The token sources a run reads: training (the training side of eval.split, when it holds out
// documents) and evaluation (eval.paths, and the held-out documents as the set "heldout"). An
// evaluation set is a fixed list of windows: window w is tokens [w * T, w * T + T + 1) of its
// files taken one after another, so every evaluation sees the same windows in the same order.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/data/token_file.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::train {

class EvalSet {
 public:
  EvalSet(std::string name, std::vector<std::unique_ptr<data::TokenFile>> files, int64_t seq_len);
  const std::string& name() const { return name_; }
  int64_t windows() const { return window_starts_.back(); }
  int64_t seq_len() const { return seq_len_; }
  // Window `w`: seq_len + 1 tokens into out (checked against [0, vocab_size) when vocab_size > 0).
  void read(int64_t w, int64_t* out, int64_t vocab_size) const;
  const std::vector<std::unique_ptr<data::TokenFile>>& files() const { return files_; }

 private:
  std::string name_;
  std::vector<std::unique_ptr<data::TokenFile>> files_;
  int64_t seq_len_;
  std::vector<int64_t> window_starts_;  // each file's first window (plus the total)
};

struct DataSources {
  std::vector<std::unique_ptr<data::TokenFile>> train;
  std::vector<EvalSet> eval;
};

// The recipe's data (data.path / data.paths, split by eval.split) and, with `with_eval`, its
// evaluation sets in the order eval.names gives them names (eval.paths, then the split).
// Throws Error{kData} naming the file (missing, malformed, no window) or Error{kConfig} (names).
DataSources open_data_sources(const config::Recipe& recipe, bool with_eval);

// The recipe's evaluation sets alone (dstrain eval): the training data is opened only for eval.split.
std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe);

// Evaluation sets from files: each named by names[i], else its file's stem.
std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len);

}  // namespace dstrain::train
