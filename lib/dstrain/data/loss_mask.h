#pragma once
// PREFIX.lossmask: which tokens of a fine-tuning dataset (PREFIX.bin/.idx) are trained. The file
// is the 8 bytes "DSTRMASK", a uint64 little-endian format version (kLossMaskVersion), then one
// uint8 per token of PREFIX.bin in order: 1 trained, 0 not. Written like the dataset (a temporary
// file renamed into place by finish(); a writer destroyed before finish() leaves nothing); read
// memory-mapped, its length checked against the dataset's token count.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "dstrain/data/mapped_file.h"

namespace dstrain::data {

constexpr uint64_t kLossMaskVersion = 1;
constexpr size_t kLossMaskHeaderBytes = 16;

class LossMaskWriter {
 public:
  explicit LossMaskWriter(std::string prefix);
  ~LossMaskWriter();
  LossMaskWriter(const LossMaskWriter&) = delete;
  LossMaskWriter& operator=(const LossMaskWriter&) = delete;
  // The mask of the next document's tokens (values other than 0 and 1 are a dstrain bug: refused).
  void add(const uint8_t* mask, size_t count);
  // stage(): the temporary file complete on disk; publish(): renamed into place (as
  // MegatronStreamWriter, so that a dataset's files are published together). finish(): both.
  void stage();
  void publish();
  void finish() { stage(), publish(); }
  int64_t tokens() const { return tokens_; }
  int64_t trained() const { return trained_; }
  uint32_t crc32c() const { return crc_; }  // of the whole file, header included
  std::string path() const { return prefix_ + ".lossmask"; }

 private:
  std::string prefix_, tmp_;
  std::FILE* file_ = nullptr;
  int64_t tokens_ = 0, trained_ = 0;
  uint32_t crc_ = 0;
  bool staged_ = false, published_ = false;
};

class LossMask {
 public:
  // Throws Error{kData} naming the file: missing, not a loss mask, a newer version, or a length
  // other than `tokens` (the dataset's).
  LossMask(const std::string& prefix, int64_t tokens);
  bool trained(int64_t token) const { return map_.bytes()[kLossMaskHeaderBytes + static_cast<size_t>(token)] != 0; }
  int64_t tokens() const { return tokens_; }
  const std::string& path() const { return path_; }
  const uint8_t* values() const { return map_.bytes() + kLossMaskHeaderBytes; }  // one per token

 private:
  std::string path_;
  MappedFile map_;
  int64_t tokens_;
};

// Whether PREFIX has a loss mask beside it.
bool has_loss_mask(const std::string& prefix);

}  // namespace dstrain::data
