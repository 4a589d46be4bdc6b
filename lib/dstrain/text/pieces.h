#pragma once
// The text of one document as the tokenizer's stages cut it: byte ranges of one buffer, each
// either plain text still to be tokenized or an added token already resolved to its id. A piece
// is 16 bytes: a long message has one per word.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::text {

struct Piece {
  uint32_t begin, end;
  int32_t token = -1;    // >= 0: an added token's id (ids are below 2^24); the range is then done
  uint32_t raw_end = 0;  // an added token found in the raw text: where it ends there (0: not known)
};

static_assert(sizeof(Piece) == 16, "a piece per word of a long message");

struct Pieces {
  std::string text;
  std::vector<Piece> list;
};

}  // namespace dstrain::text
