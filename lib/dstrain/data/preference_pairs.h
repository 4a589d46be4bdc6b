#pragma once
// A prepare-data --preference set as training reads it (train.objective dpo): position p of the
// global order is a pair (a seeded permutation of the pairs per pass, as for conversations), and
// a micro-batch of n pairs is 2n rows: pair i's chosen sequence in row 2i, its rejected one in
// row 2i + 1, each alone in its row from position 0 and right-padded, labels over the completion
// only. The reference model's log-probs (train/reference_logps.h) ride with each batch once the
// reference pass has filled the shared table.
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
}
namespace dstrain::data {

// The reference's completion log-prob sum of each document of the set (2 per pair), in file order;
// empty until made or read.
using ReferenceTable = std::vector<double>;

class PreferencePairs final : public BatchSource {
 public:
  // Opens data.path and checks it (Error{kData}: not a pair set, a sequence longer than a row).
  PreferencePairs(const config::Recipe& recipe, int rank);
  ~PreferencePairs() override;
  int64_t rows() const override { return pairs_; }  // pairs, one pass
  // Global positions [first, first + count) of the seeded order: 2 x count rows.
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  // Pairs [first, first + count) in file order (the reference pass); pairs from `end` on train nothing.
  Batch in_order(int64_t first, int64_t count, int64_t end) const;
  std::string describe() const override;
  // The table each batch reads its reference log-probs from (filled before the first batch).
  const std::shared_ptr<ReferenceTable>& reference() const { return reference_; }
  const std::string& path() const { return path_; }

 private:
  Batch rows_of(const std::vector<int64_t>& pairs, int64_t real) const;

  std::string path_;
  int64_t seq_len_, pad_, pairs_ = 0;
  std::unique_ptr<ConversationSet> documents_;
  GlobalSampler order_;
  std::shared_ptr<ReferenceTable> reference_ = std::make_shared<ReferenceTable>();
};

}  // namespace dstrain::data
