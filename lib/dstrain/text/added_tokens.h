#pragma once
// The added (and special) tokens of a tokenizer.json, found in the text before pre-tokenization
// as Hugging Face does: leftmost-longest matches, with `lstrip`/`rstrip` taking the whitespace
// around a match into the token. Tokens with normalized=false are matched in the raw text, the
// others in the normalized text.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstrain/text/pieces.h"

namespace dstrain::text {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, normalized = true, special = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }
  // Cuts the plain piece `piece` of `text` at every match, appending to `out`.
  void split(std::string_view text, const Piece& piece, std::vector<Piece>& out) const;

 private:
  std::vector<AddedToken> tokens_;                // longest first
  std::array<std::vector<uint32_t>, 256> first_;  // by first byte: indices into tokens_
};

}  // namespace dstrain::text
