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

Regex::Regex(const std::string& pattern, RegexSyntax syntax, const std::string& hint) : pattern_(pattern) {
  static std::once_flag initialized;
  std::call_once(initialized, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
  OnigRegex compiled = nullptr;
  OnigErrorInfo info{};
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int status = onig_new(&compiled, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                              syntax == RegexSyntax::kPython ? ONIG_SYNTAX_PYTHON : ONIG_SYNTAX_DEFAULT, &info);
  if (status != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN] = {};
    onig_error_code_to_str(message, status, &info);
    throw Error(ErrorCode::kData,
                fmt::format("the regular expression '{}' does not compile: {}", pattern, reinterpret_cast<char*>(message)),
                hint.empty() ? "fix the pattern in tokenizer.json (it is read with Oniguruma's syntax, as Hugging Face tokenizers reads it)"
                             : hint);
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

std::vector<std::vector<std::string>> Regex::find_groups(std::string_view text) const {
  const auto regex = static_cast<OnigRegex>(regex_);
  const int groups = onig_number_of_captures(regex);
  std::vector<std::vector<std::string>> out;
  thread_local Region groups_of;  // for_each_match's own region is busy while `match` runs
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  for_each_match(text, [&](uint32_t b, uint32_t e) {
    if (groups == 0) return out.push_back({std::string(text.substr(b, e - b))});
    onig_region_clear(groups_of.region);
    onig_match(regex, begin, begin + text.size(), begin + b, groups_of.region, ONIG_OPTION_NONE);
    std::vector<std::string> values;
    for (int g = 1; g <= groups; ++g) {
      const auto gb = groups_of.region->beg[g], ge = groups_of.region->end[g];
      values.push_back(gb < 0 ? std::string() : std::string(text.substr(static_cast<size_t>(gb), static_cast<size_t>(ge - gb))));
    }
    out.push_back(std::move(values));
  });
  return out;
}

std::string Regex::remove_all(std::string_view text) const {
  std::string out;
  size_t kept = 0;
  for_each_match(text, [&](uint32_t b, uint32_t e) {
    out.append(text.substr(kept, b - kept));
    kept = e;
  });
  return out.append(text.substr(kept));
}

void Regex::find_all(std::string_view text, std::vector<ByteRange>& out) const {
  for_each_match(text, [&](uint32_t b, uint32_t e) { out.emplace_back(b, e); });
}

}  // namespace dstrain::text
