#pragma once
// Token sources. `bytes` format: every byte of a file is one token (vocab 256), so the demo
// needs no tokenizer and no download. Megatron and llm.c formats come with the data issue.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::data {

struct TokenFile {
  std::string path;
  std::vector<uint16_t> tokens;
};

// Throws Error{kData} naming the file when it is missing or too short for one sample.
TokenFile load_token_file(const std::string& path, const std::string& format, int64_t seq_len);

}  // namespace dstrain::data
