#pragma once
// Token sources, memory-mapped and zero-copy, each validated on open with errors that name the
// file. Formats (byte layouts in shared/docs/reference/file-formats.md):
//   bytes     every byte of a file is a token (vocab 256); no tokenizer, no download
//   megatron  Megatron-LM indexed dataset: PREFIX.idx + PREFIX.bin, dtype codes 1-8, documents
//   llmc      llm.c .bin: 1024-byte header, v1 uint16 (magic 20240520) or v7 uint32 (20240801)
//   raw_u16   nanoGPT's headerless little-endian uint16 array
// A source is one stream of tokens: documents back to back, samples may cross them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"

namespace dstrain::data {

// What at() returns for a float token that is not a whole number (NaN, inf, 2.5, 1e300).
constexpr int64_t kNotWhole = INT64_MIN;

class TokenFile {
 public:
  virtual ~TokenFile() = default;
  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens
  // Token `i` of the stream, widened to int64 (kNotWhole for a float that is not a whole number).
  virtual int64_t at(int64_t i) const = 0;
  // Where documents start, in token offsets (empty when the format has no documents).
  const std::vector<int64_t>& document_starts() const { return document_starts_; }

 protected:
  std::string path_;
  int64_t size_ = 0;
  std::vector<int64_t> document_starts_;
};

// Opens `path` in `format`; for megatron, `path` is the prefix or either file. Throws
// Error{kData} naming the file when it is missing, malformed, or too short for one sample of
// seq_len + 1 tokens.
std::unique_ptr<TokenFile> open_token_file(const std::string& path, config::DataFormat format, int64_t seq_len);

// Writers (tests, prepare-data): a Megatron dataset with one sequence per document, and an
// llm.c file. Atomic; uint16 when every token fits, else int32 (Megatron's choice at 65500).
void write_megatron(const std::string& prefix, const std::vector<std::vector<int64_t>>& documents, int dtype_code = 0);
void write_llmc(const std::string& path, const std::vector<int64_t>& tokens, int version);

}  // namespace dstrain::data
