// data::Batch: pretraining's labels, positions that restart per document, the trained-target
// count, and the document ids that give the same mask as the token-based one.
#include <ATen/ATen.h>

#include "catch_torch.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"

using namespace dstrain;

namespace {
// Two rows of T + 1 = 9 tokens; 9 ends a document.
at::Tensor windows() { return at::tensor({1, 2, 9, 3, 4, 5, 9, 6, 7, /**/ 1, 2, 3, 4, 5, 6, 7, 8, 9}, at::kLong).view({2, 9}); }
std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  const at::Tensor x = t[r].contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}
}  // namespace

TEST_CASE("a pretraining batch: labels are the shifted tokens, every target trained", "[data]") {
  const data::Batch b = data::pretraining_batch(windows());
  CHECK(b.rows() == 2);
  CHECK(b.length() == 8);
  CHECK(row(b.tokens, 0) == std::vector<int64_t>{1, 2, 9, 3, 4, 5, 9, 6});
  CHECK(row(b.labels, 0) == std::vector<int64_t>{2, 9, 3, 4, 5, 9, 6, 7});
  CHECK(b.trained_targets == 16);
  CHECK(b.sequential_positions);
  CHECK(row(b.positions, 1) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK_FALSE(b.document_ids.defined());  // documents not cut: plain causal attention
  CHECK(b.document_lengths == std::vector<std::vector<int64_t>>{{8}, {8}});
}

TEST_CASE("positions restart in each document; the document ids give the token-based mask", "[data]") {
  const data::Batch b = data::pretraining_batch(windows(), 9, /*mask_documents=*/true, /*restart_positions=*/true);
  CHECK_FALSE(b.sequential_positions);
  CHECK(row(b.positions, 0) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0});  // the end token belongs to its document
  CHECK(row(b.positions, 1) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(b.document_lengths == std::vector<std::vector<int64_t>>{{3, 4, 1}, {8}});
  CHECK(row(b.document_ids, 0) == std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 2});
  CHECK(at::equal(model::document_causal_mask_of(b.document_ids), model::document_causal_mask(b.tokens, 9)));
  // data.document_mask alone keeps positions 0..T-1 (what runs before data.reset_positions did).
  const data::Batch masked = data::pretraining_batch(windows(), 9, true, false);
  CHECK(masked.sequential_positions);
  CHECK(row(masked.positions, 0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(masked.document_ids.defined());
  // data.reset_positions alone: positions restart, attention is not cut.
  const data::Batch reset = data::pretraining_batch(windows(), 9, false, true);
  CHECK(row(reset.positions, 0) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0});
  CHECK_FALSE(reset.document_ids.defined());
}

TEST_CASE("a labelled batch counts the targets that are not ignored", "[data]") {
  const at::Tensor tokens = at::arange(12, at::kLong).view({2, 6});
  at::Tensor labels = tokens.clone();
  labels.narrow(1, 0, 4).fill_(data::kIgnoreIndex);  // a prompt of 4 tokens trains nothing
  labels[1][5] = data::kIgnoreIndex;
  const data::Batch b = data::labelled_batch(tokens, labels);
  CHECK(b.trained_targets == 3);
  CHECK(b.sequential_positions);
  CHECK(row(b.positions, 1) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  const data::Batch on = b.to(at::kCPU);
  CHECK(on.trained_targets == 3);
  CHECK(at::equal(on.labels, labels));
}
