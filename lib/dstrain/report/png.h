#pragma once
// A minimal PNG encoder for the report's charts: 8-bit RGB, each row with PNG's Sub filter (charts
// are runs of one colour), compressed by zlib at its best level: a chart is a few KB.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::report {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  Image(int w, int h, uint32_t background = 0xFFFFFF);
  void set(int x, int y, uint32_t color);
  void line(double x0, double y0, double x1, double y1, uint32_t color, int thickness = 1);
  void rect(int x0, int y0, int x1, int y1, uint32_t color);  // filled, inclusive
};

std::string encode_png(const Image& image);
uint32_t crc32_ieee(const void* data, size_t size, uint32_t crc = 0);  // PNG's chunk CRC

}  // namespace dstrain::report
