#include "dstrain/data/sample_stream.h"

#include <fmt/format.h>

#include "dstrain/core/error.h"

namespace dstrain::data {

SampleStream::SampleStream(std::vector<std::unique_ptr<TokenFile>> files, std::vector<double> weights, int64_t seq_len, uint64_t seed,
                           int64_t vocab_size)
    : files_(std::move(files)), seq_len_(seq_len), vocab_size_(vocab_size) {
  if (weights.empty())  // several files without weights: in proportion to their sizes
    for (const auto& f : files_) weights.push_back(static_cast<double>((f->size() - 1) / seq_len));
  double total = 0;
  for (double w : weights) total += w;
  for (size_t i = 0; i < files_.size(); ++i) {
    weights_.push_back(weights[i] / total);
    samplers_.emplace_back((files_[i]->size() - 1) / seq_len, seed + 1000003ull * i);  // independent orders per source
  }
  counts_.assign(files_.size(), 0);
}

int64_t SampleStream::num_samples() const {
  int64_t n = 0;
  for (const auto& s : samplers_) n += s.num_samples();
  return n;
}

int SampleStream::source_of(int64_t position, int64_t& index_in_source) {
  if (files_.size() == 1) return index_in_source = position, 0;
  if (position < next_) next_ = 0, counts_.assign(files_.size(), 0);  // a jump back: replay
  int chosen = 0;
  while (next_ <= position) {
    // The source furthest behind its target share of the first next_+1 samples.
    double worst = -1e300;
    for (size_t s = 0; s < files_.size(); ++s) {
      const double error = weights_[s] * static_cast<double>(next_ + 1) - static_cast<double>(counts_[s]);
      if (error > worst) worst = error, chosen = static_cast<int>(s);
    }
    index_in_source = counts_[static_cast<size_t>(chosen)]++;
    ++next_;
  }
  return chosen;
}

void SampleStream::read(int64_t position, int64_t* out) {
  int64_t k = 0;
  const int s = source_of(position, k);
  const int64_t start = samplers_[static_cast<size_t>(s)].sample_at(k) * seq_len_;
  const TokenFile& f = *files_[static_cast<size_t>(s)];
  for (int64_t t = 0; t <= seq_len_; ++t) {
    out[t] = f.at(start + t);
    if (vocab_size_ > 0 && (out[t] < 0 || out[t] >= vocab_size_))
      throw Error(ErrorCode::kData,
                  fmt::format("{}: the token at offset {} is {}", f.path(), start + t,
                              out[t] == kNotWhole ? "not a whole number (NaN, infinite or fractional)"
                                                  : fmt::format("{}, outside the model's vocabulary [0, {})", out[t], vocab_size_)),
                  "the data was tokenized for another vocabulary or is corrupt: re-tokenize it, or set model.vocab_size to the "
                  "tokenizer's size");
  }
}

}  // namespace dstrain::data
