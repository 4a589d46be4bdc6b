#pragma once
// Writes a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) one document at a time: tokens
// stream into PREFIX.bin.tmp, the lengths stay in memory, and finish() writes the index and
// renames both into place atomically. A writer destroyed before finish() removes its temporary
// file, so a failed run never leaves a dataset that looks whole.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dstrain::data {

class MegatronStreamWriter {
 public:
  // dtype: Megatron's code 8 (uint16) or 4 (int32).
  MegatronStreamWriter(std::string prefix, int dtype_code);
  ~MegatronStreamWriter();
  MegatronStreamWriter(const MegatronStreamWriter&) = delete;
  MegatronStreamWriter& operator=(const MegatronStreamWriter&) = delete;

  // One document. Throws Error{kData} when it is longer than an int32 length allows.
  void add_document(const uint32_t* tokens, size_t count, const std::string& origin);
  void finish();

  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }
  uint32_t bin_crc32c() const { return bin_crc_; }
  uint32_t idx_crc32c() const { return idx_crc_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_, tmp_;
  int dtype_code_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<char> staging_;
  int64_t tokens_ = 0;
  uint32_t bin_crc_ = 0, idx_crc_ = 0;
  bool finished_ = false;
};

}  // namespace dstrain::data
