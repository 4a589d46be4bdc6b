#include "dstrain/report/png.h"

#include <algorithm>
#include <cmath>

namespace dstrain::report {
namespace {

void be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xFF));
}

void chunk(std::string& out, const char* type, const std::string& data) {
  be32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  be32(out, crc32_ieee(body.data(), body.size()));
}

}  // namespace

uint32_t crc32_ieee(const void* data, size_t size, uint32_t crc) {
  static uint32_t table[256];
  static const bool ready = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)ready;
  crc = ~crc;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

Image::Image(int w, int h, uint32_t background) : width(w), height(h), rgb(static_cast<size_t>(w) * static_cast<size_t>(h) * 3) {
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) set(x, y, background);
}

void Image::set(int x, int y, uint32_t color) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3];
  p[0] = static_cast<uint8_t>(color >> 16);
  p[1] = static_cast<uint8_t>(color >> 8);
  p[2] = static_cast<uint8_t>(color);
}

void Image::line(double x0, double y0, double x1, double y1, uint32_t color, int thickness) {
  const double steps = std::max({std::abs(x1 - x0), std::abs(y1 - y0), 1.0});
  for (int i = 0; i <= static_cast<int>(steps); ++i) {
    const double t = i / steps;
    const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t)), y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
    for (int dx = -(thickness / 2); dx <= thickness / 2; ++dx)
      for (int dy = -(thickness / 2); dy <= thickness / 2; ++dy) set(x + dx, y + dy, color);
  }
}

void Image::rect(int x0, int y0, int x1, int y1, uint32_t color) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, color);
}

std::string encode_png(const Image& img) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  be32(header, static_cast<uint32_t>(img.width));
  be32(header, static_cast<uint32_t>(img.height));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, no filter method, no interlace
  chunk(out, "IHDR", header);
  // Raw scanlines, each with filter type 0.
  std::string raw;
  const size_t row = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&img.rgb[static_cast<size_t>(y) * row]), row);
  }
  // zlib: header, stored deflate blocks of at most 65535 bytes, Adler-32.
  std::string z("\x78\x01", 2);
  for (size_t at = 0; at < raw.size() || at == 0;) {
    const size_t n = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + n >= raw.size();
    z.push_back(last ? '\x01' : '\x00');
    z.push_back(static_cast<char>(n & 0xFF));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xFF));
    z.push_back(static_cast<char>((~n >> 8) & 0xFF));
    z.append(raw, at, n);
    at += n;
    if (last) break;
  }
  uint32_t a = 1, b = 0;
  for (unsigned char c : raw) a = (a + c) % 65521, b = (b + a) % 65521;
  be32(z, (b << 16) | a);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  return out;
}

}  // namespace dstrain::report
