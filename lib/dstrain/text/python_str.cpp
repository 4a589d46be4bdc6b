#include "dstrain/text/python_str.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <iterator>

#include "dstrain/text/utf8.h"

namespace dstrain::text {

bool is_python_space(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680) return true;
  return (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t python_rstrip_end(const std::string& s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode_utf8(s, i);
    i += c.length;
    if (!is_python_space(c.value)) end = i;
  }
  return end;
}

std::string python_strip(const std::string& s) {
  const std::string right = s.substr(0, python_rstrip_end(s));
  size_t begin = 0;
  while (begin < right.size()) {
    const CodePoint c = decode_utf8(right, begin);
    if (!is_python_space(c.value)) break;
    begin += c.length;
  }
  return right.substr(begin);
}

std::string python_lower(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const CodePoint c = decode_utf8(s, i);
    i += c.length;
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c.value))));
  }
  return out;
}

std::string remove_ascii_punctuation(const std::string& s) {
  std::string out;
  std::copy_if(s.begin(), s.end(), std::back_inserter(out), [](char c) { return !std::ispunct(static_cast<unsigned char>(c)); });
  return out;
}

}  // namespace dstrain::text
