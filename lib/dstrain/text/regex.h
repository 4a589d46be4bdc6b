#pragma once
// A compiled regular expression for the tokenizer's pre-tokenizers. It uses Oniguruma, the engine
// (and default syntax) of Hugging Face `tokenizers`, so a tokenizer.json pattern means exactly
// what it means there: \p{L}, \s, (?i:...), lookahead and all. Thread-safe: one Regex may be
// searched from many threads at once.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dstrain::text {

using ByteRange = std::pair<uint32_t, uint32_t>;  // [begin, end) in bytes

class Regex {
 public:
  // Throws Error{kData} quoting the pattern and Oniguruma's message when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in `text`, left to right, as `tokenizers` finds them (an empty match right where
  // the previous one ended is skipped by one character). Appends to `out`.
  void find_all(std::string_view text, std::vector<ByteRange>& out) const;
  // The same matches, each handed to `match` as it is found (nothing held for the whole text).
  void for_each_match(std::string_view text, const std::function<void(uint32_t, uint32_t)>& match) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* regex_ = nullptr;  // OnigRegex; kept out of the header
};

}  // namespace dstrain::text
