#include "dstrain/data/sample_stream.h"

#include <fmt/format.h>

#include "dstrain/core/error.h"

namespace dstrain::data {
namespace {

// Several files without weights: in proportion to their sizes.
std::vector<double> blend_weights(const std::vector<std::unique_ptr<TokenFile>>& files, std::vector<double> weights, int64_t seq_len) {
  if (weights.empty())
    for (const auto& f : files) weights.push_back(static_cast<double>((f->size() - 1) / seq_len));
  return weights;
}

}  // namespace

SampleStream::SampleStream(std::vector<std::unique_ptr<TokenFile>> files, std::vector<double> weights, int64_t seq_len, uint64_t seed,
                           int64_t vocab_size)
    : files_(std::move(files)), blend_(blend_weights(files_, std::move(weights), seq_len)), seq_len_(seq_len), vocab_size_(vocab_size) {
  for (size_t i = 0; i < files_.size(); ++i)
    samplers_.emplace_back((files_[i]->size() - 1) / seq_len, seed + 1000003ull * i);  // independent orders per source
}

int64_t SampleStream::num_samples() const {
  int64_t n = 0;
  for (const auto& s : samplers_) n += s.num_samples();
  return n;
}

void SampleStream::read(int64_t position, int64_t* out) {
  int64_t k = 0;
  const size_t s = blend_.source_of(position, k);
  const int64_t start = samplers_[s].sample_at(k) * seq_len_;
  const TokenFile& f = *files_[s];
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
