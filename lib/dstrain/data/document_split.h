#pragma once
// eval.split: whole documents of a training source held out for evaluation. The source's
// documents (a Megatron index, else cut after each end-of-document token) are chosen by a seeded
// permutation, the same on every rank and machine; each side is a token source of its documents
// back to back, in file order. Training windows come from the training side only, so no held-out
// token is ever trained on.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/data/token_file.h"

namespace dstrain::data {

// Some documents of another source, back to back. at() remembers the last document it read, so
// one view serves one thread (the data plan's prefetch, or the evaluator).
class DocumentSubset final : public TokenFile {
 public:
  // `documents`: [begin, end) token ranges of `base`, in order.
  DocumentSubset(std::shared_ptr<const TokenFile> base, const std::vector<std::pair<int64_t, int64_t>>& documents, std::string label);
  int64_t at(int64_t i) const override;

 private:
  std::shared_ptr<const TokenFile> base_;
  std::vector<int64_t> view_starts_;  // each document's first token here (plus the end)
  std::vector<int64_t> base_starts_;  // ... and in base
  mutable size_t last_ = 0;
};

// Where the documents of `file` start, in token offsets, and the end: its own document index, or
// one document after each `eos` token (a tail without one is a document too). Empty when the file
// has neither.
std::vector<int64_t> document_boundaries(const TokenFile& file, int64_t eos);

// The documents eval.split holds out of a source's `n` (< 1: that fraction, at least one; >= 1:
// that count), chosen by a seeded permutation of its own, ascending. Throws Error{kData} naming
// `path` when the source has none, or when none would be left to train on. `noun` names them
// in the messages ("documents", "conversations").
std::vector<int64_t> held_out_documents(int64_t n, double split, uint64_t seed, const std::string& path,
                                        const std::string& noun = "documents");

// 0..n-1 but `held` (ascending, as held_out_documents gives them): what training reads.
std::vector<int64_t> documents_left(int64_t n, const std::vector<int64_t>& held);

struct DocumentSplit {
  std::unique_ptr<TokenFile> train, held_out;
  std::vector<int64_t> held_out_documents;  // indices into the file's documents, ascending
  int64_t documents = 0;
};

// Holds out `split` documents of `file` (< 1: that fraction, at least one; >= 1: that count),
// chosen from `seed`. Throws Error{kData} naming the file when it has no documents, when the
// split leaves no training document, or when either side is shorter than one window of
// seq_len + 1 tokens.
DocumentSplit split_documents(std::unique_ptr<TokenFile> file, int64_t eos, double split, uint64_t seed, int64_t seq_len);

}  // namespace dstrain::data
