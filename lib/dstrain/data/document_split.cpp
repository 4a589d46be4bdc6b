#include "dstrain/data/document_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dstrain/core/error.h"
#include "dstrain/data/global_sampler.h"

namespace dstrain::data {

DocumentSubset::DocumentSubset(std::shared_ptr<const TokenFile> base, const std::vector<std::pair<int64_t, int64_t>>& documents,
                               std::string label)
    : base_(std::move(base)) {
  path_ = std::move(label);
  view_starts_.reserve(documents.size() + 1);
  base_starts_.reserve(documents.size());
  for (const auto& [begin, end] : documents) {
    document_starts_.push_back(size_);
    view_starts_.push_back(size_);
    base_starts_.push_back(begin);
    size_ += end - begin;
  }
  view_starts_.push_back(size_);
}

int64_t DocumentSubset::at(int64_t i) const {
  // Windows read forward: the document of the last read, or the next one, nearly always.
  if (!(view_starts_[last_] <= i && i < view_starts_[last_ + 1])) {
    if (last_ + 2 < view_starts_.size() && view_starts_[last_ + 1] <= i && i < view_starts_[last_ + 2])
      ++last_;
    else
      last_ = static_cast<size_t>(std::upper_bound(view_starts_.begin(), view_starts_.end(), i) - view_starts_.begin()) - 1;
  }
  return base_->at(base_starts_[last_] + (i - view_starts_[last_]));
}

std::vector<int64_t> document_boundaries(const TokenFile& file, int64_t eos) {
  std::vector<int64_t> bounds = file.document_starts();
  if (bounds.empty() && eos >= 0) {
    bounds.push_back(0);
    for (int64_t i = 0; i + 1 < file.size(); ++i)
      if (file.at(i) == eos) bounds.push_back(i + 1);
  }
  if (!bounds.empty() && bounds.back() != file.size()) bounds.push_back(file.size());
  return bounds;
}

std::vector<int64_t> documents_left(int64_t n, const std::vector<int64_t>& held) {
  std::vector<int64_t> out;
  size_t next = 0;
  for (int64_t d = 0; d < n; ++d)
    if (next < held.size() && held[next] == d)
      ++next;
    else
      out.push_back(d);
  return out;
}

std::vector<int64_t> held_out_documents(int64_t n, double split, uint64_t seed, const std::string& path, const std::string& noun) {
  if (n == 0)
    throw Error(ErrorCode::kData, fmt::format("{}: eval.split holds out whole {}, and the file marks none", path, noun),
                "set data.eos_token to the token that ends each document, or give eval.paths");
  const int64_t k = split < 1 ? std::max<int64_t>(1, std::llround(split * static_cast<double>(n))) : static_cast<int64_t>(split);
  if (k >= n)
    throw Error(ErrorCode::kData,
                fmt::format("{}: eval.split {:g} holds out {} of its {} {}, which leaves none to train on", path, split, k, n, noun),
                fmt::format("hold out fewer {} (a smaller eval.split), or give a separate evaluation set in eval.paths", noun));
  GlobalSampler order(n, seed ^ 0x6576616c73706c74ull);  // "evalsplt": its own order, not the training data's
  std::vector<int64_t> held;
  for (int64_t i = 0; i < k; ++i) held.push_back(order.sample_at(i));
  std::sort(held.begin(), held.end());
  return held;
}

DocumentSplit split_documents(std::unique_ptr<TokenFile> file, int64_t eos, double split, uint64_t seed, int64_t seq_len) {
  const std::string path = file->path();
  const std::vector<int64_t> bounds = document_boundaries(*file, eos);
  const int64_t n = bounds.empty() ? 0 : static_cast<int64_t>(bounds.size()) - 1;
  DocumentSplit out;
  out.documents = n;
  out.held_out_documents = held_out_documents(n, split, seed, path);
  std::vector<std::pair<int64_t, int64_t>> train, held;
  size_t next = 0;
  for (int64_t d = 0; d < n; ++d) {
    const bool out_of_training = next < out.held_out_documents.size() && out.held_out_documents[next] == d;
    if (out_of_training) ++next;
    (out_of_training ? held : train).emplace_back(bounds[static_cast<size_t>(d)], bounds[static_cast<size_t>(d) + 1]);
  }
  std::shared_ptr<const TokenFile> base = std::move(file);
  out.train = std::make_unique<DocumentSubset>(base, train, path);
  out.held_out = std::make_unique<DocumentSubset>(base, held, path + " (held out)");
  for (const auto* side : {out.train.get(), out.held_out.get()})
    if (side->size() < seq_len + 1)
      throw Error(
          ErrorCode::kData,
          fmt::format("{}: eval.split {:g} leaves {} {} tokens, fewer than one window of data.seq_len + 1 = {}", path, split,
                      side == out.train.get() ? "the training documents" : "the held-out documents", side->size(), seq_len + 1),
          side == out.train.get() ? "hold out fewer documents (a smaller eval.split)" : "hold out more documents (a larger eval.split)");
  return out;
}

}  // namespace dstrain::data
