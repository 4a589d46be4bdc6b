#pragma once
// tokenizer.json normalizers that dstrain implements: NFC, NFD, NFKC, NFKD, Lowercase, Prepend,
// Replace, Strip, and Sequence (the steps in order). Anything else is refused when loading.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dstrain/text/regex.h"

namespace dstrain::text {

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip } kind = Kind::kNfc;
  std::string text;                    // Prepend: what; Replace: the literal pattern (when no regex)
  std::string content;                 // Replace: the replacement
  std::shared_ptr<const Regex> regex;  // Replace with a Regex pattern
  bool left = false, right = false;    // Strip
};

class Normalizer {
 public:
  void add(NormalizerStep step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // `in` normalized into `out` (replaced). `in` must be valid UTF-8.
  void apply(std::string_view in, std::string& out) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace dstrain::text
