#include "dstrain/data/token_file.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "dstrain/core/error.h"

namespace dstrain::data {

TokenFile load_token_file(const std::string& path, const std::string& format, int64_t seq_len) {
  if (format != "bytes")
    throw Error(ErrorCode::kData, fmt::format("data format '{}' is not supported", format), "use data.format: bytes");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::kData, fmt::format("cannot open data file '{}'", path), "check data.path in the recipe");
  TokenFile file{path, {}};
  char c;
  while (in.get(c)) file.tokens.push_back(static_cast<uint8_t>(c));
  if (static_cast<int64_t>(file.tokens.size()) < seq_len + 1)
    throw Error(ErrorCode::kData,
                fmt::format("data file '{}' has {} tokens, fewer than one sample of seq_len + 1 = {}", path, file.tokens.size(), seq_len + 1),
                "use a larger file or a smaller data.seq_len");
  return file;
}

}  // namespace dstrain::data
