// The report's PNG encoder (report/png.h): chunk CRCs and the stored scanlines.
#include "catch_torch.h"

#include <string>

#include <zlib.h>

#include "dstrain/report/png.h"

using namespace dstrain;

TEST_CASE("PNG: chunk CRCs are CRC-32 (IEEE) and the image is stored as written", "[report]") {
  CHECK(report::crc32_ieee("123456789", 9) == 0xCBF43926u);  // the CRC-32 check value
  report::Image img(3, 2);
  img.set(1, 1, 0xFF0000);
  const std::string png = report::encode_png(img);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(png.substr(12, 4) == "IHDR");
  CHECK(png.substr(png.size() - 8, 4) == "IEND");
  // IDAT inflates to Sub-filtered scanlines (filter byte 1, each byte minus the pixel to its left).
  const size_t idat = png.find("IDAT");
  REQUIRE(idat != std::string::npos);
  const uint32_t idat_size = (static_cast<uint8_t>(png[idat - 4]) << 24) | (static_cast<uint8_t>(png[idat - 3]) << 16) |
                             (static_cast<uint8_t>(png[idat - 2]) << 8) | static_cast<uint8_t>(png[idat - 1]);
  std::string raw(64, '\0');
  uLongf raw_size = raw.size();
  REQUIRE(uncompress(reinterpret_cast<Bytef*>(raw.data()), &raw_size, reinterpret_cast<const Bytef*>(png.data() + idat + 4), idat_size) ==
          Z_OK);
  raw.resize(raw_size);
  const std::string white_row = std::string("\1\xff\xff\xff\0\0\0\0\0\0", 10);
  const std::string red_middle = std::string("\1\xff\xff\xff\0\x01\x01\0\xff\xff", 10);  // red - white, then white - red
  CHECK(raw == white_row + red_middle);
}
