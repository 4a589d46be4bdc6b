#include "dstrain/text/byte_level.h"

#include <array>

#include "dstrain/text/utf8.h"

namespace dstrain::text {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 324> to_byte{};  // every alphabet character is below U+0144
  Tables() {
    to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      to_byte[to_char[b]] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_level_char(unsigned char byte) { return tables().to_char[byte]; }

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const CodePoint cp = decode_utf8(token, i);
    if (cp.value >= tables().to_byte.size() || tables().to_byte[cp.value] < 0) return std::nullopt;
    out += static_cast<char>(tables().to_byte[cp.value]);
    i += cp.length;
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_level_char(b));
  return out;
}

}  // namespace dstrain::text
