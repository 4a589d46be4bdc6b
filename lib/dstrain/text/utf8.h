#pragma once
// UTF-8 helpers for the tokenizer: decoding one code point, repairing invalid input the way
// Python's errors="replace" does (U+FFFD per maximal invalid subpart), and the two character
// classes Hugging Face tokenizers take from Rust: char::is_whitespace and char::is_numeric.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dstrain::text {

// The code point at s[i] and its length in bytes; for an invalid sequence, U+FFFD and the length
// of its maximal invalid subpart (at least 1).
struct CodePoint {
  char32_t value;
  uint32_t length;
};
CodePoint decode_utf8(std::string_view s, size_t i);

// Appends code point `c` in UTF-8.
void append_utf8(std::string& out, char32_t c);

// `s` with every invalid subpart replaced by U+FFFD; returns how many were replaced. Valid input
// (the common case) is left as it is, without a copy.
size_t repair_utf8(std::string& s);

bool is_unicode_whitespace(char32_t c);  // Unicode White_Space, as Rust's char::is_whitespace
bool is_unicode_numeric(char32_t c);     // general category Nd, Nl or No, as char::is_numeric

}  // namespace dstrain::text
