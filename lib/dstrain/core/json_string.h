#pragma once
// A string as a JSON string literal, as Python's json.dumps(s, ensure_ascii=False) writes it:
// quotes, backslashes and control characters escaped, everything else (UTF-8) as it is. Header
// only, so that the Parquet plugin, which links nothing of dstrain's, uses it too.
#include <cstdio>
#include <string>
#include <string_view>

namespace dstrain {

inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    const char* escaped = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                          : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f"
                                      : nullptr;
    if (escaped) {
      out += escaped;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace dstrain
