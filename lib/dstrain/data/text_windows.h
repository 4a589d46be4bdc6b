#pragma once
// Text as batch sources (data/batch_source.h): T + 1-token windows of token files.
//   TextWindows     training: the windows of every file in the recipe's blend, in a seeded order
//                   (SampleStream); position p is a window of any pass
//   HeldOutWindows  evaluation: each file's consecutive windows in file order, every target scored
#include <memory>
#include <vector>

#include "dstrain/data/batch_source.h"

namespace dstrain::data {

class SampleStream;
class TokenFile;

class TextWindows final : public BatchSource {
 public:
  explicit TextWindows(std::unique_ptr<SampleStream> stream, int64_t seq_len, const WindowOptions& options);
  ~TextWindows() override;
  int64_t rows() const override;
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  std::string describe() const override;

 private:
  std::unique_ptr<SampleStream> stream_;
  int64_t seq_len_;
  WindowOptions options_;
};

class HeldOutWindows final : public BatchSource {
 public:
  // Throws Error{kData} naming the set when its files hold no window.
  HeldOutWindows(std::string name, std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len, const WindowOptions& options);
  ~HeldOutWindows() override;
  int64_t rows() const override { return window_starts_.back(); }
  Batch batch(int64_t first, int64_t count, int64_t end = kNoEnd) override;
  std::string describe() const override;
  // Window `w`: seq_len + 1 tokens into out (checked against the options' vocabulary).
  void read(int64_t w, int64_t* out) const;

 private:
  std::string name_;
  std::vector<std::unique_ptr<TokenFile>> files_;
  int64_t seq_len_;
  WindowOptions options_;
  std::vector<int64_t> window_starts_;  // each file's first window (plus the total)
};

// Windows [B, T + 1] as a batch under `options`; rows from `real` on train nothing.
Batch windows_batch(const at::Tensor& windows, const WindowOptions& options, int64_t real);

}  // namespace dstrain::data
