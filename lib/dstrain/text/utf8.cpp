#include "dstrain/text/utf8.h"

#include <utf8proc.h>

namespace dstrain::text {

CodePoint decode_utf8(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {b0, 1};
  uint32_t need;
  char32_t value;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (no overlongs, no surrogates)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, value = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, value = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0xFFFD, 1};
  }
  for (uint32_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {0xFFFD, k};
    const uint8_t b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return {0xFFFD, k};
    value = (value << 6) | (b & 0x3F);
  }
  return {value, need + 1};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

size_t repair_utf8(std::string& s) {
  size_t i = 0;
  while (i < s.size() && static_cast<uint8_t>(s[i]) < 0x80) ++i;  // ASCII prefix: nothing to check
  size_t first_bad = i;
  for (; first_bad < s.size();) {
    const CodePoint cp = decode_utf8(s, first_bad);
    if (cp.value == 0xFFFD && !(cp.length == 3 && s.compare(first_bad, 3, "\xEF\xBF\xBD") == 0)) break;
    first_bad += cp.length;
  }
  if (first_bad >= s.size()) return 0;
  std::string out = s.substr(0, first_bad);
  size_t replaced = 0;
  for (size_t k = first_bad; k < s.size();) {
    const CodePoint cp = decode_utf8(s, k);
    const bool genuine = !(cp.value == 0xFFFD && !(cp.length == 3 && s.compare(k, 3, "\xEF\xBF\xBD") == 0));
    if (genuine) {
      out.append(s, k, cp.length);
    } else {
      append_utf8(out, 0xFFFD);
      ++replaced;
    }
    k += cp.length;
  }
  s.swap(out);
  return replaced;
}

bool is_unicode_whitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_unicode_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL || category == UTF8PROC_CATEGORY_NO;
}

}  // namespace dstrain::text
