#pragma once
// A prepare-data --preference set as training reads it (every train.objective but sft): position p of the
// global order is a pair (a seeded permutation of the pairs per pass, as for conversations), and
// a micro-batch of n pairs is 2n rows: pair i's chosen sequence in row 2i, its rejected one in
// row 2i + 1, each alone in its row from position 0 and right-padded, labels over the completion
// only. The reference model's log-probs (train/reference_logps.h) ride with each batch once the
// reference pass has filled the shared table; for a reward model (model.score_head), each row's
// score position (data/score_token.h) and, when the set has them, its pairs' margins.
// train.objective kto reads an unpaired set (prepare-data --preference --kto, data/kto_set.h) the
// same way: a position is an example, row 2i holds it and row 2i + 1 its KL sequence, and the
// batch carries each example's label (data::Batch::desirable).
// Evaluation reads pairs in file order: the pairs eval.split holds out of the training set
// (held_out(): they share its file and its reference table) or a whole set of eval.paths.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/data/batch_source.h"
#include "dstrain/data/conversation_set.h"
#include "dstrain/data/global_sampler.h"

namespace dstrain::config {
struct Recipe;
struct DatasetSidecar;
}  // namespace dstrain::config
namespace dstrain::data {

// The reference's completion log-prob sum of each document of the set (2 per pair), in file order;
// empty until made or read.
using ReferenceTable = std::vector<double>;

// A preference batch's chosen sequences' targets, prompt included: each real chosen row's length - 1.
int64_t chosen_sequence_targets(const Batch& batch);

class PreferencePairs final : public BatchSource {
 public:
  // Training's: data.path, less the pairs eval.split holds out, in a seeded order per pass.
  PreferencePairs(const config::Recipe& recipe, int rank);
  // An evaluation set's: every pair of `path`, in file order.
  PreferencePairs(const config::Recipe& recipe, const std::string& path);
  ~PreferencePairs() override;
  // The pairs eval.split held out of this training set, in file order (nullptr: none).
  std::unique_ptr<PreferencePairs> held_out() const;
  int64_t rows() const override { return static_cast<int64_t>(selected_.size()); }  // pairs, one pass
  bool pairs() const override { return true; }
  // Positions [first, first + count): of the seeded order (training), or of the selected pairs in
  // file order (evaluation). 2 x count rows.
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  // The file's pairs [first, first + count) in file order, held-out ones included (the reference
  // pass); pairs from `end` on train nothing.
  Batch in_order(int64_t first, int64_t count, int64_t end) const;
  int64_t file_pairs() const { return file_pairs_; }
  // What a position is, for messages: "pairs", or "examples" (an unpaired set).
  const char* unit() const { return labels_.empty() ? "pairs" : "examples"; }
  int64_t chosen_targets_in(int64_t count) const override;
  // The chosen sequences' every target, prompt included (train.objective orpo's NLL), of the first `count` pairs.
  int64_t chosen_sequence_targets_in(int64_t count) const;
  std::string describe() const override;
  // The table each batch reads its reference log-probs from (filled before the first batch).
  const std::shared_ptr<ReferenceTable>& reference() const { return reference_; }
  const std::string& path() const { return path_; }
  // Whether this source owns its reference table (held_out() reads its training set's).
  bool owns_reference() const { return owns_reference_; }

 private:
  PreferencePairs(const PreferencePairs& training, std::vector<int64_t> held);
  void open(const config::Recipe& recipe);
  void warn_unbalanced(const config::Recipe& recipe) const;
  void read_margins(const config::Recipe& recipe, const config::DatasetSidecar& sidecar);
  Batch rows_of(const std::vector<int64_t>& pairs, int64_t real) const;

  std::string path_;
  int64_t seq_len_, pad_, file_pairs_ = 0, trained_tokens_ = 0;
  int64_t score_pad_ = -1;  // a reward model's pad token (data/score_token.h); -1: no score positions
  bool ordered_, owns_reference_ = true;
  std::shared_ptr<const ConversationSet> documents_;
  std::vector<int64_t> selected_, held_;  // the file pairs this source reads; those eval.split holds out
  GlobalSampler order_;
  std::shared_ptr<ReferenceTable> reference_ = std::make_shared<ReferenceTable>();
  std::string labels_;  // an unpaired set's, per example: '1' desirable; empty for pairs
  // Each pair's margin (TRL's reward "margin" column: Batch::margins) when train.objective reward
  // reads a set that has them; empty otherwise.
  std::vector<double> margins_;
  bool unread_margins_ = false;  // the set has margins that train.objective does not read
};

}  // namespace dstrain::data
