#include "dstrain/text/regex.h"

#include <fmt/format.h>
#include <oniguruma.h>

#include <mutex>

#include "dstrain/core/error.h"
#include "dstrain/text/utf8.h"

namespace dstrain::text {
namespace {

// One match region per thread, reused by every search on it.
struct Region {
  OnigRegion* region = onig_region_new();
  ~Region() { onig_region_free(region, 1); }
};

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  static std::once_flag initialized;
  std::call_once(initialized, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
  OnigRegex compiled = nullptr;
  OnigErrorInfo info{};
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int status = onig_new(&compiled, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (status != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN] = {};
    onig_error_code_to_str(message, status, &info);
    throw Error(ErrorCode::kData,
                fmt::format("the regular expression '{}' does not compile: {}", pattern, reinterpret_cast<char*>(message)),
                "fix the pattern in tokenizer.json (it is read with Oniguruma's syntax, as Hugging Face tokenizers reads it)");
  }
  regex_ = compiled;
}

Regex::~Regex() {
  if (regex_) onig_free(static_cast<OnigRegex>(regex_));
}

void Regex::for_each_match(std::string_view text, const std::function<void(uint32_t, uint32_t)>& match) const {
  thread_local Region scratch;  // read before `match` runs: it may search again
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  size_t from = 0;
  int64_t last_match_end = -1;
  while (from <= text.size()) {
    onig_region_clear(scratch.region);
    const auto found = onig_search(static_cast<OnigRegex>(regex_), begin, end, begin + from, end, scratch.region, ONIG_OPTION_NONE);
    if (found == ONIG_MISMATCH) return;
    if (found < 0)
      throw Error(ErrorCode::kData,
                  fmt::format("the regular expression '{}' failed while searching (Oniguruma status {})", pattern_, found),
                  "simplify the pattern: it may need too much backtracking on this input");
    const auto match_begin = static_cast<uint32_t>(scratch.region->beg[0]);
    const auto match_end = static_cast<uint32_t>(scratch.region->end[0]);
    if (match_begin == match_end && last_match_end == match_end) {
      from += from < text.size() ? decode_utf8(text, from).length : 1;  // step over one character
      continue;
    }
    from = match_end;
    last_match_end = match_end;
    match(match_begin, match_end);
  }
}

void Regex::find_all(std::string_view text, std::vector<ByteRange>& out) const {
  for_each_match(text, [&](uint32_t b, uint32_t e) { out.emplace_back(b, e); });
}

}  // namespace dstrain::text
