#pragma once
// The tokens of a conversation's prefix renderings without encoding each from its start. A prefix
// shares its first bytes with the whole rendering, whose ids are known with the places where an
// added token cuts them (text/tokenizer.h's cuts): only the text after the last cut that both
// agree on is encoded. Chat templates end every turn with a special token, so the work per prefix
// is about one turn, and a conversation costs time linear in its turns.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dstrain/text/tokenizer.h"

namespace dstrain::data {

class PrefixTokens {
 public:
  // Encodes `full` (without the post-processor's tokens, as chat templates are) into ids().
  // `full` is not copied: it must outlive this object (a long message's rendering is large).
  PrefixTokens(const text::Tokenizer& tokenizer, text::Tokenizer::Session& session, const std::string& full);
  const std::string& full() const { return full_; }
  std::vector<uint32_t>& ids() { return ids_; }

  // Of the text full[:shared] + tail: how many tokens it encodes as, and how many of those are
  // the first ids() (where it differs from the whole rendering, the tokens before that point).
  size_t count(size_t shared, std::string_view tail);
  size_t common(size_t shared, std::string_view tail);

 private:
  struct Rest {
    size_t ids;        // ids of the whole rendering the text begins with
    std::string text;  // what follows them, to encode
  };
  Rest rest(size_t shared, std::string_view tail) const;
  const std::vector<uint32_t>& encode(const std::string& text);

  const text::Tokenizer& tokenizer_;
  text::Tokenizer::Session& session_;
  const std::string& full_;
  std::vector<uint32_t> ids_, scratch_;
  std::vector<text::Tokenizer::TokenCut> cuts_;
  size_t longest_added_;
};

}  // namespace dstrain::data
