#pragma once
// A 5x7 bitmap font (printable ASCII), so the report's PNG charts carry their title, tick
// numbers, axis labels and legend without a font library. Each glyph is 6 pixels wide with its
// spacing, 8 high, times `scale`.
#include <cstdint>
#include <string_view>

#include "dstrain/report/png.h"

namespace dstrain::report {

constexpr int kGlyphWidth = 6, kGlyphHeight = 8;

int text_width(std::string_view text, int scale = 1);
// Left to right with its top-left corner at (x, y).
void draw_text(Image& image, int x, int y, std::string_view text, uint32_t color, int scale = 1);
// Bottom to top (rotated a quarter turn counterclockwise), the baseline on the right, starting
// at (x, y), the lower-left corner of the first glyph.
void draw_text_up(Image& image, int x, int y, std::string_view text, uint32_t color, int scale = 1);

}  // namespace dstrain::report
