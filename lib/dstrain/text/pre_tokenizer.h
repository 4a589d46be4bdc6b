#pragma once
// tokenizer.json pre-tokenizers that dstrain implements: Split (a regex or a literal, with
// `behavior` and `invert`), Digits, ByteLevel (last, as every byte-level tokenizer has it), and
// Sequence. Each step cuts every plain piece again, as Hugging Face's PreTokenizedString::split
// does; empty pieces are dropped.
#include <memory>
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
  // Cuts the plain pieces of `pieces` (using `scratch` as working space).
  void apply(Pieces& pieces, Pieces& scratch) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace dstrain::text
