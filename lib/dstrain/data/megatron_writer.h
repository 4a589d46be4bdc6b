#pragma once
// Writes a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) one document at a time: tokens
// stream into PREFIX.bin.tmp, the lengths stay in memory. stage() completes PREFIX.bin.tmp and
// PREFIX.idx.tmp on disk (fsynced); publish() renames them into place, so that a dataset's other
// files (its loss mask, PREFIX.json) can be staged first and all of them published together
// (data/dataset_set.h). finish() does both. A writer destroyed unpublished removes its temporary
// files, so a failed run never leaves a dataset that looks whole, nor touches an older one.
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
  void stage();
  void publish();
  void finish() { stage(), publish(); }

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
  bool staged_ = false, published_ = false;
};

}  // namespace dstrain::data
