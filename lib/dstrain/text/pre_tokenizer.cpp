#include "dstrain/text/pre_tokenizer.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "dstrain/text/utf8.h"

namespace dstrain::text {
namespace {

struct Part {
  uint32_t begin, end;
  bool match;
};

// The matches of a step in `s` and the gaps between them, covering all of `s` (tokenizers'
// Pattern::find_matches).
void find_parts(const PreTokenizerStep& step, std::string_view s, std::vector<Part>& parts, std::vector<ByteRange>& matches) {
  parts.clear();
  matches.clear();
  if (s.empty()) return parts.push_back({0, 0, false});
  if (step.kind == PreTokenizerStep::Kind::kDigits) {
    for (size_t i = 0; i < s.size();) {  // every numeric character is one match
      const CodePoint cp = decode_utf8(s, i);
      if (is_unicode_numeric(cp.value)) matches.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + cp.length));
      i += cp.length;
    }
  } else if (step.regex) {
    step.regex->find_all(s, matches);
  } else {
    for (size_t at = s.find(step.literal); at != std::string_view::npos; at = s.find(step.literal, at + step.literal.size()))
      matches.emplace_back(static_cast<uint32_t>(at), static_cast<uint32_t>(at + step.literal.size()));
  }
  uint32_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) parts.push_back({previous, begin, false});
    parts.push_back({begin, end, true});
    previous = end;
  }
  if (previous != s.size()) parts.push_back({previous, static_cast<uint32_t>(s.size()), false});
}

// tokenizers' SplitDelimiterBehavior applied to `parts`, in place; the result's `match` flags
// mean nothing.
void apply_behavior(std::vector<Part>& parts, SplitBehavior behavior, bool invert) {
  if (invert)
    for (auto& p : parts) p.match = !p.match;
  std::vector<Part> out;
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return;
    case SplitBehavior::kRemoved:
      for (const auto& p : parts)
        if (!p.match) out.push_back(p);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& p : parts) {
        if (p.match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& p : parts) {
        if (p.match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      break;
  }
  parts.swap(out);
}

// ByteLevel's add_prefix_space: a space before every plain piece that does not start with one.
void prefix_spaces(Pieces& pieces, Pieces& scratch) {
  scratch.text.clear();
  scratch.list.clear();
  for (const auto& piece : pieces.list) {
    const auto begin = static_cast<uint32_t>(scratch.text.size());
    if (piece.token < 0 && (piece.end == piece.begin || pieces.text[piece.begin] != ' ')) scratch.text += ' ';
    scratch.text.append(pieces.text, piece.begin, piece.end - piece.begin);
    scratch.list.push_back({begin, static_cast<uint32_t>(scratch.text.size()), piece.token});
  }
  std::swap(pieces, scratch);
}

}  // namespace

void PreTokenizer::apply(Pieces& pieces, Pieces& scratch) const {
  std::vector<Part> parts;
  std::vector<ByteRange> matches;
  for (const auto& step : steps_) {
    if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
      if (step.add_prefix_space) prefix_spaces(pieces, scratch);
      if (!step.regex) continue;
    }
    scratch.list.clear();
    for (const auto& piece : pieces.list) {
      if (piece.token >= 0) {
        scratch.list.push_back(piece);
        continue;
      }
      find_parts(step, std::string_view(pieces.text).substr(piece.begin, piece.end - piece.begin), parts, matches);
      const SplitBehavior behavior = step.kind == PreTokenizerStep::Kind::kSplit ? step.behavior
                                     : step.kind == PreTokenizerStep::Kind::kDigits
                                         ? (step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous)
                                         : SplitBehavior::kIsolated;
      apply_behavior(parts, behavior, step.kind == PreTokenizerStep::Kind::kSplit && step.invert);
      for (const auto& p : parts)
        if (p.end > p.begin) scratch.list.push_back({piece.begin + p.begin, piece.begin + p.end, -1});
    }
    pieces.list.swap(scratch.list);
  }
}

}  // namespace dstrain::text
