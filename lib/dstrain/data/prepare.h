#pragma once
// `dstrain prepare-data`: text files and directories -> a Megatron indexed dataset of byte-level
// tokens (0-255 are bytes, 256 ends a document; vocab 257, uint16), one sequence per file.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dstrain::data {

constexpr int64_t kByteEos = 256;
constexpr int64_t kByteVocab = 257;

struct PrepareOptions {
  std::vector<std::string> inputs;      // files and directories (walked recursively, sorted)
  std::vector<std::string> extensions;  // keep files with these suffixes; empty: all files
  std::string output_prefix;            // writes PREFIX.bin, PREFIX.idx, PREFIX.json
  int64_t max_bytes = 0;                // stop after this much input; 0: no limit
};

struct PrepareSummary {
  int64_t documents = 0;
  int64_t tokens = 0;
  uint32_t bin_crc32c = 0, idx_crc32c = 0;
};

// `progress` is called now and then with (documents, tokens) so far.
PrepareSummary prepare_bytes_dataset(const PrepareOptions& options, const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace dstrain::data
