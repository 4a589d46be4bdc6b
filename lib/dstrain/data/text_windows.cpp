#include "dstrain/data/text_windows.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "dstrain/core/error.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {

Batch windows_batch(const at::Tensor& windows, const WindowOptions& o, int64_t real) {
  const int64_t eos = o.document_mask || o.reset_positions ? o.eos_token : -1;
  Batch b = pretraining_batch(windows, eos, o.document_mask, o.reset_positions);
  const int64_t count = windows.size(0), seq_len = windows.size(1) - 1;
  if (real < count) {             // rows past the set's end: same shape, nothing counted
    b.labels = b.labels.clone();  // a view of the windows that the tokens share
    b.labels.narrow(0, real, count - real).fill_(kIgnoreIndex);
    b.trained_targets = real * seq_len;
  }
  return b;
}

TextWindows::TextWindows(std::unique_ptr<SampleStream> stream, int64_t seq_len, const WindowOptions& options)
    : stream_(std::move(stream)), seq_len_(seq_len), options_(options) {}

TextWindows::~TextWindows() = default;

int64_t TextWindows::rows() const { return stream_->num_samples(); }

Batch TextWindows::batch(int64_t first, int64_t count, int64_t end) {
  at::Tensor windows = at::empty({count, seq_len_ + 1}, at::kLong);
  auto* out = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) stream_->read(first + i, out + i * (seq_len_ + 1));
  return windows_batch(windows, options_, std::clamp<int64_t>(end - first, 0, count));
}

std::string TextWindows::describe() const {
  return fmt::format("{} windows of {} tokens from {} file(s)", rows(), seq_len_ + 1, stream_->num_sources());
}

HeldOutWindows::HeldOutWindows(std::string name, std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len,
                               const WindowOptions& options)
    : name_(std::move(name)), files_(std::move(files)), seq_len_(seq_len), options_(options) {
  window_starts_.push_back(0);
  for (const auto& f : files_) window_starts_.push_back(window_starts_.back() + std::max<int64_t>(0, (f->size() - 1) / seq_len));
  if (rows() == 0)
    throw Error(ErrorCode::kData,
                fmt::format("evaluation set '{}' ({}) holds no window of data.seq_len + 1 = {} tokens", name_,
                            files_.empty() ? "no files" : files_.front()->path(), seq_len + 1),
                "give a larger evaluation set, or a shorter data.seq_len");
}

HeldOutWindows::~HeldOutWindows() = default;

void HeldOutWindows::read(int64_t w, int64_t* out) const {
  const size_t f = static_cast<size_t>(std::upper_bound(window_starts_.begin(), window_starts_.end(), w) - window_starts_.begin()) - 1;
  const TokenFile& file = *files_[f];
  const int64_t start = (w - window_starts_[f]) * seq_len_, vocab_size = options_.vocab_size;
  for (int64_t t = 0; t <= seq_len_; ++t) {
    out[t] = file.at(start + t);
    if (vocab_size > 0 && (out[t] < 0 || out[t] >= vocab_size))
      throw Error(ErrorCode::kData,
                  fmt::format("{}: the token at offset {} is {}, outside the model's vocabulary [0, {})", file.path(), start + t,
                              out[t] == kNotWhole ? std::string("not a whole number") : std::to_string(out[t]), vocab_size),
                  "the evaluation set was tokenized for another vocabulary: tokenize it with the training data's tokenizer");
  }
}

Batch HeldOutWindows::batch(int64_t first, int64_t count, int64_t end) {
  const int64_t real = std::clamp<int64_t>(std::min(end, rows()) - first, 0, count);
  at::Tensor windows = at::empty({count, seq_len_ + 1}, at::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) read(i < real ? first + i : 0, out + i * (seq_len_ + 1));
  return windows_batch(windows, options_, real);
}

std::string HeldOutWindows::describe() const {
  return fmt::format("evaluation set '{}': {} windows of {} tokens, every target scored", name_, rows(), seq_len_ + 1);
}

}  // namespace dstrain::data
