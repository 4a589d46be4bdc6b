#include "dstrain/text/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <optional>
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
// Pattern::find_matches), each handed to `part` in order.
void for_each_part(const PreTokenizerStep& step, std::string_view s, const std::function<void(Part)>& part) {
  if (s.empty()) return part({0, 0, false});
  uint32_t previous = 0;
  const auto match = [&](uint32_t begin, uint32_t end) {
    if (previous != begin) part({previous, begin, false});
    part({begin, end, true});
    previous = end;
  };
  if (step.kind == PreTokenizerStep::Kind::kDigits) {
    for (size_t i = 0; i < s.size();) {  // every numeric character is one match
      const CodePoint cp = decode_utf8(s, i);
      if (is_unicode_numeric(cp.value)) match(static_cast<uint32_t>(i), static_cast<uint32_t>(i + cp.length));
      i += cp.length;
    }
  } else if (step.regex) {
    step.regex->for_each_match(s, match);
  } else {
    for (size_t at = s.find(step.literal); at != std::string_view::npos; at = s.find(step.literal, at + step.literal.size()))
      match(static_cast<uint32_t>(at), static_cast<uint32_t>(at + step.literal.size()));
  }
  if (previous != s.size()) part({previous, static_cast<uint32_t>(s.size()), false});
}

// tokenizers' SplitDelimiterBehavior over a stream of parts, with at most one part held back:
// what each behavior merges is a match with the part before it (MergedWithPrevious), a match
// with the part after it (MergedWithNext), or runs of parts alike (Contiguous).
class Behavior {
 public:
  Behavior(SplitBehavior behavior, bool invert, const std::function<void(Part)>& out) : behavior_(behavior), invert_(invert), out_(out) {}
  void add(Part p) {
    if (invert_) p.match = !p.match;
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        return out_(p);
      case SplitBehavior::kRemoved:
        if (!p.match) out_(p);
        return;
      case SplitBehavior::kMergedWithPrevious:
        if (p.match && !previous_match_ && held_) {
          held_->end = p.end;
        } else {
          flush();
          held_ = p;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        if (p.match) {
          flush();
          held_ = p;
        } else if (held_) {
          out_({held_->begin, p.end, false});
          held_.reset();
        } else {
          out_(p);
        }
        break;
      case SplitBehavior::kContiguous:
        if (held_ && p.match == previous_match_) {
          held_->end = p.end;
        } else {
          flush();
          held_ = p;
        }
        break;
    }
    previous_match_ = p.match;
  }
  void flush() {
    if (held_) out_(*held_);
    held_.reset();
  }

 private:
  SplitBehavior behavior_;
  bool invert_;
  const std::function<void(Part)>& out_;
  std::optional<Part> held_;
  bool previous_match_ = false;
};

}  // namespace

// Step `step` on `piece`, then the next steps on each piece it gives: one piece of the text at a
// time, so a long message never has all of its pieces (16 bytes a word) held at once.
void PreTokenizer::cut(size_t step, std::string_view piece, const std::function<void(std::string_view)>& leaf) const {
  if (step == steps_.size()) return leaf(piece);
  const PreTokenizerStep& st = steps_[step];
  std::string spaced;
  if (st.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (st.add_prefix_space && (piece.empty() || piece[0] != ' ')) {  // ByteLevel's add_prefix_space
      spaced.reserve(piece.size() + 1);
      spaced.append(" ").append(piece);
      piece = spaced;
    }
    if (!st.regex) return cut(step + 1, piece, leaf);
  }
  const SplitBehavior behavior = st.kind == PreTokenizerStep::Kind::kSplit ? st.behavior
                                 : st.kind == PreTokenizerStep::Kind::kDigits
                                     ? (st.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous)
                                     : SplitBehavior::kIsolated;
  const std::function<void(Part)> next = [&](Part p) {
    if (p.end > p.begin) cut(step + 1, piece.substr(p.begin, p.end - p.begin), leaf);  // empty pieces are dropped
  };
  Behavior parts(behavior, st.kind == PreTokenizerStep::Kind::kSplit && st.invert, next);
  for_each_part(st, piece, [&](Part p) { parts.add(p); });
  parts.flush();
}

void PreTokenizer::for_each_piece(std::string_view text, const std::function<void(std::string_view)>& leaf) const { cut(0, text, leaf); }

}  // namespace dstrain::text
