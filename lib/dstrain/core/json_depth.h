#pragma once
// How deeply JSON text nests arrays and objects, found by one scan before it is parsed: a parsed
// document is copied, printed, compared and converted by recursion, so one line of 40,000 '['
// would overflow the stack. Readers of untrusted JSON (conversations, tokenizer.json) refuse text
// nested deeper than kMaxJsonDepth; real data nests a few levels (a tool call's arguments, ten).
#include <cstddef>
#include <string_view>

namespace dstrain {

constexpr size_t kMaxJsonDepth = 128;

// The deepest nesting in `text`, or limit + 1 as soon as it exceeds `limit` (strings skipped;
// text that is not JSON gives some number, and its parser then refuses it).
inline size_t json_nesting_depth(std::string_view text, size_t limit = kMaxJsonDepth) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return limit + 1;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace dstrain
