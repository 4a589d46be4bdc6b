#pragma once
// The text of one document as the tokenizer's stages cut it: byte ranges of one buffer, each
// either plain text still to be tokenized or an added token already resolved to its id.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::text {

struct Piece {
  uint32_t begin, end;
  int64_t token = -1;  // >= 0: an added token's id; the range is then done
};

struct Pieces {
  std::string text;
  std::vector<Piece> list;
};

}  // namespace dstrain::text
