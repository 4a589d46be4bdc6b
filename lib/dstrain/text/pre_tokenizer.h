#pragma once
// tokenizer.json pre-tokenizers that dstrain implements: Split (a regex or a literal, with
// `behavior` and `invert`), Digits, ByteLevel (last, as every byte-level tokenizer has it), and
// Sequence. Each step cuts every plain piece again, as Hugging Face's PreTokenizedString::split
// does; empty pieces are dropped. Pieces go through the steps one at a time (depth first), which
// gives the same pieces in the same order as cutting all of them by each step in turn.
#include <functional>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "dstrain/text/pieces.h"
#include "dstrain/text/regex.h"

namespace dstrain::text {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kDigits, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;  // Split with a Regex pattern, or ByteLevel's GPT-2 regex
  std::string literal;                 // Split with a String pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool individual_digits = false;  // Digits
  bool add_prefix_space = false;   // ByteLevel
};

class PreTokenizer {
 public:
  void add(PreTokenizerStep step) { steps_.push_back(std::move(step)); }
  // Cuts one plain piece of text by every step in turn, handing each final piece to `leaf` in
  // order as soon as it is cut.
  void for_each_piece(std::string_view text, const std::function<void(std::string_view)>& leaf) const;

 private:
  void cut(size_t step, std::string_view piece, const std::function<void(std::string_view)>& leaf) const;
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace dstrain::text
