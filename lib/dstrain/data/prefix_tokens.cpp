#include "dstrain/data/prefix_tokens.h"

#include <algorithm>

namespace dstrain::data {

PrefixTokens::PrefixTokens(const text::Tokenizer& tokenizer, text::Tokenizer::Session& session, const std::string& full)
    : tokenizer_(tokenizer), session_(session), full_(full), longest_added_(tokenizer.longest_added_token()) {
  tokenizer_.encode(full_, ids_, session_, false, &cuts_);
}

PrefixTokens::Rest PrefixTokens::rest(size_t shared, std::string_view tail) const {
  shared = std::min(shared, full_.size());
  size_t agree = shared;  // bytes the text has in common with the whole rendering
  while (agree < full_.size() && agree - shared < tail.size() && full_[agree] == tail[agree - shared]) ++agree;
  const size_t length = shared + tail.size();
  // A cut holds for a text that ends at it, or agrees with the whole for an added token's length past it.
  const size_t usable = agree == length ? agree : agree >= longest_added_ ? agree - longest_added_ : 0;
  const auto after =
      std::upper_bound(cuts_.begin(), cuts_.end(), usable, [](size_t byte, const text::Tokenizer::TokenCut& c) { return byte < c.byte; });
  const size_t byte = after == cuts_.begin() ? 0 : std::prev(after)->byte;
  Rest r{after == cuts_.begin() ? 0 : std::prev(after)->ids, {}};
  if (byte < shared) r.text.assign(full_, byte, shared - byte);
  r.text.append(tail.substr(std::min(tail.size(), byte > shared ? byte - shared : 0)));
  return r;
}

const std::vector<uint32_t>& PrefixTokens::encode(const std::string& text) {
  scratch_.clear();
  tokenizer_.encode(text, scratch_, session_, false);
  return scratch_;
}

size_t PrefixTokens::count(size_t shared, std::string_view tail) {
  const Rest r = rest(shared, tail);
  if (r.ids > 0 && r.text.empty()) return r.ids;  // the text ends at a cut (an empty text still encodes, as ever)
  return r.ids + encode(r.text).size();
}

size_t PrefixTokens::common(size_t shared, std::string_view tail) {
  const Rest r = rest(shared, tail);
  if (r.ids > 0 && r.text.empty()) return r.ids;  // the text ends at a cut: its ids are the whole rendering's first r.ids
  const std::vector<uint32_t>& more = encode(r.text);
  size_t k = r.ids;
  while (k - r.ids < more.size() && k < ids_.size() && more[k - r.ids] == ids_[k]) ++k;
  return k;
}

}  // namespace dstrain::data
