#pragma once
// A compiled regular expression, with Oniguruma. The tokenizer's pre-tokenizers read patterns in
// its default syntax, the engine and syntax of Hugging Face `tokenizers`, so a tokenizer.json
// pattern means exactly what it means there: \p{L}, \s, (?i:...), lookahead and all. Task files
// (answer extraction) read them in its Python syntax, as Python's `re` reads them: (?s) is dotall,
// $ matches at the end or before a final newline. Thread-safe: one Regex may be searched from many
// threads at once.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dstrain::text {

using ByteRange = std::pair<uint32_t, uint32_t>;  // [begin, end) in bytes

enum class RegexSyntax { kTokenizers, kPython };

class Regex {
 public:
  // Throws Error{kData} quoting the pattern and Oniguruma's message when it does not compile, with
  // `hint` (default: fix tokenizer.json's pattern).
  explicit Regex(const std::string& pattern, RegexSyntax syntax = RegexSyntax::kTokenizers, const std::string& hint = "");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in `text`, left to right, as `tokenizers` finds them (an empty match right where
  // the previous one ended is skipped by one character). Appends to `out`.
  void find_all(std::string_view text, std::vector<ByteRange>& out) const;
  // The same matches, each handed to `match` as it is found (nothing held for the whole text).
  void for_each_match(std::string_view text, const std::function<void(uint32_t, uint32_t)>& match) const;
  const std::string& pattern() const { return pattern_; }

  // Python's re.findall: each match's groups (1 to N), or the whole match when the pattern has no
  // groups; a group that took no part is "".
  std::vector<std::vector<std::string>> find_groups(std::string_view text) const;
  // Python's re.sub(pattern, "", text): every match removed.
  std::string remove_all(std::string_view text) const;

 private:
  std::string pattern_;
  void* regex_ = nullptr;  // OnigRegex; kept out of the header
};

}  // namespace dstrain::text
