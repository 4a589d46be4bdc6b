#include "dstrain/text/added_tokens.h"

#include <algorithm>
#include <string_view>

#include "dstrain/text/utf8.h"

namespace dstrain::text {
namespace {

// Where the whitespace at the end of s[0, end) begins (tokenizers' space_leftmost_at_end).
uint32_t whitespace_start_before(std::string_view s, uint32_t end) {
  uint32_t at = end;
  while (at > 0) {
    uint32_t start = at - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!is_unicode_whitespace(decode_utf8(s, start).value)) break;
    at = start;
  }
  return at;
}

// Where the whitespace that starts at s[begin] ends.
uint32_t whitespace_end_after(std::string_view s, uint32_t begin, uint32_t limit) {
  uint32_t at = begin;
  while (at < limit) {
    const CodePoint cp = decode_utf8(s.substr(0, limit), at);
    if (!is_unicode_whitespace(cp.value)) break;
    at += cp.length;
  }
  return at;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  tokens_.erase(std::remove_if(tokens_.begin(), tokens_.end(), [](const AddedToken& t) { return t.content.empty(); }), tokens_.end());
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (uint32_t i = 0; i < tokens_.size(); ++i) first_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
}

void AddedTokenMatcher::split(std::string_view text, const Piece& piece, std::vector<Piece>& out) const {
  const std::string_view sentence = text.substr(piece.begin, piece.end - piece.begin);
  uint32_t done = 0;  // offsets relative to the piece
  for (uint32_t i = 0; i < sentence.size(); ++i) {
    const auto& candidates = first_[static_cast<unsigned char>(sentence[i])];
    const AddedToken* found = nullptr;
    for (uint32_t index : candidates) {
      const auto& t = tokens_[index];
      if (sentence.compare(i, t.content.size(), t.content) == 0) {
        found = &t;
        break;
      }
    }
    if (!found) continue;
    uint32_t start = i, stop = i + static_cast<uint32_t>(found->content.size());
    if (found->lstrip) start = std::max(whitespace_start_before(sentence, start), done);
    if (found->rstrip) stop = whitespace_end_after(sentence, stop, static_cast<uint32_t>(sentence.size()));
    if (done < start) out.push_back({piece.begin + done, piece.begin + start, -1});
    out.push_back({piece.begin + start, piece.begin + stop, static_cast<int32_t>(found->id)});
    done = stop;
    i = stop - 1;  // continue after the match
  }
  if (done < sentence.size()) out.push_back({piece.begin + done, piece.end, -1});
}

}  // namespace dstrain::text
