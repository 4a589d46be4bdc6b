#include "dstrain/report/png.h"

#include <algorithm>
#include <cmath>

#include <zlib.h>

#include "dstrain/core/error.h"

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
  // Scanlines with filter type 1 (Sub: each byte minus the one a pixel to its left).
  std::string raw;
  const size_t row = static_cast<size_t>(img.width) * 3;
  raw.reserve((row + 1) * static_cast<size_t>(img.height));
  for (int y = 0; y < img.height; ++y) {
    raw.push_back('\1');
    const uint8_t* p = &img.rgb[static_cast<size_t>(y) * row];
    for (size_t i = 0; i < row; ++i) raw.push_back(static_cast<char>(p[i] - (i >= 3 ? p[i - 3] : 0)));
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string z(size, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 9) !=
      Z_OK)
    throw Error(ErrorCode::kInternal, "zlib could not compress a chart", "");
  z.resize(size);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  return out;
}

}  // namespace dstrain::report
