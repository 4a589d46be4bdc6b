#include "dstrain/text/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "dstrain/text/utf8.h"

namespace dstrain::text {
namespace {

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

void unicode_normalize(std::string& s, int options) {
  if (is_ascii(s)) return;  // every normal form leaves ASCII as it is
  utf8proc_uint8_t* mapped = nullptr;
  const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &mapped,
                                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (length >= 0) s.assign(reinterpret_cast<char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
}

// Rust's char::to_lowercase, one character at a time: the simple mapping, plus U+0130's
// unconditional two-character one.
void lowercase(std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const CodePoint cp = decode_utf8(s, i);
    i += cp.length;
    if (cp.value == 0x130) {
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp.value))));
  }
  s.swap(out);
}

void replace_all(std::string& s, const NormalizerStep& step) {
  std::vector<ByteRange> matches;
  if (step.regex) {
    step.regex->find_all(s, matches);
  } else if (!step.text.empty()) {
    for (size_t at = s.find(step.text); at != std::string::npos; at = s.find(step.text, at + step.text.size()))
      matches.emplace_back(static_cast<uint32_t>(at), static_cast<uint32_t>(at + step.text.size()));
  }
  if (matches.empty()) return;
  std::string out;
  uint32_t from = 0;
  for (const auto& [begin, end] : matches) out.append(s, from, begin - from).append(step.content), from = end;
  out.append(s, from, std::string::npos);
  s.swap(out);
}

void strip(std::string& s, bool left, bool right) {
  size_t begin = 0, end = s.size();
  while (left && begin < end) {
    const CodePoint cp = decode_utf8(s, begin);
    if (!is_unicode_whitespace(cp.value)) break;
    begin += cp.length;
  }
  while (right && end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!is_unicode_whitespace(decode_utf8(s, start).value)) break;
    end = start;
  }
  s = s.substr(begin, end - begin);
}

}  // namespace

void Normalizer::apply(std::string_view in, std::string& out) const {
  out.assign(in.data(), in.size());
  for (const auto& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc:
        unicode_normalize(out, UTF8PROC_COMPOSE);
        break;
      case NormalizerStep::Kind::kNfd:
        unicode_normalize(out, UTF8PROC_DECOMPOSE);
        break;
      case NormalizerStep::Kind::kNfkc:
        unicode_normalize(out, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case NormalizerStep::Kind::kNfkd:
        unicode_normalize(out, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case NormalizerStep::Kind::kLowercase:
        lowercase(out);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!out.empty()) out.insert(0, step.text);
        break;
      case NormalizerStep::Kind::kReplace:
        replace_all(out, step);
        break;
      case NormalizerStep::Kind::kStrip:
        strip(out, step.left, step.right);
        break;
    }
  }
}

}  // namespace dstrain::text
