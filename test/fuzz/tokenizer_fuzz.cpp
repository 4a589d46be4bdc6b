// Fuzzes prepare-data's tokenizer (issue 24) with hostile input of two kinds:
//  - text (first byte even): repaired as prepare-data repairs it, then encoded with tokenizers
//    that use every component dstrain implements, and decoded again;
//  - tokenizer.json (first byte odd): loaded, and when it loads, used to encode a fixed text.
// A clean Error is fine; a crash, a sanitizer report, a hang or a decode that does not give the
// byte-level text back is a bug.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/text/tokenizer.h"
#include "dstrain/text/utf8.h"

namespace {

const char* kByteLevel = R"({"added_tokens": [
  {"id": 6, "content": "<|endoftext|>", "special": true, "normalized": false, "lstrip": true, "rstrip": true},
  {"id": 7, "content": "<x>", "special": false, "normalized": true}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Strip"},
   {"type": "Replace", "pattern": {"Regex": "\\s{3,}"}, "content": "  "}]},
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
   {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated"},
   {"type": "Split", "pattern": {"String": ","}, "behavior": "MergedWithPrevious"},
   {"type": "Split", "pattern": {"Regex": "\\p{Han}+"}, "behavior": "Contiguous", "invert": true},
   {"type": "Digits", "individual_digits": false},
   {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}]},
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [6]}}},
 "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "ignore_merges": true, "vocab": {VOCAB}, "merges": [["a", "b"], ["ab", "c"], ["Ġ", "a"]]}})";

const char* kCharLevel = R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, {"type": "NFD"}]},
 "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
   "vocab": {"<unk>": 0, "▁": 1, "a": 2, "▁a": 3, "<0x41>": 4, "<0xC3>": 5, "<0xA9>": 6}, "merges": ["▁ a"]}})";

std::string byte_level_vocab() {
  // Every byte (in GPT-2's alphabet) plus the merges' results.
  std::string v;
  int id = 8, extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    std::string s;
    dstrain::text::append_utf8(s, c);
    if (s == "\"") s = "\\\"";
    if (s == "\\") s = "\\\\";
    v += "\"" + s + "\": " + std::to_string(id++) + ", ";
  }
  return "{" + v + "\"ab\": 0, \"abc\": 1, \"Ġa\": 2}";
}

const std::vector<std::shared_ptr<const dstrain::text::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::string byte_level = kByteLevel;
    byte_level.replace(byte_level.find("{VOCAB}"), 7, byte_level_vocab());
    return std::vector<std::shared_ptr<const dstrain::text::Tokenizer>>{dstrain::text::Tokenizer::from_json(byte_level, "byte-level"),
                                                                        dstrain::text::Tokenizer::from_json(kCharLevel, "char-level")};
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      dstrain::text::repair_utf8(rest);
      dstrain::text::Tokenizer::Session session;
      for (const auto& t : tokenizers()) {
        std::vector<uint32_t> ids;
        t->encode(rest, ids, session);
        if (t == tokenizers()[0]) t->decode(ids);  // every id must decode
      }
    } else {
      const auto t = dstrain::text::Tokenizer::from_json(rest, "fuzzed");
      dstrain::text::Tokenizer::Session session;
      std::vector<uint32_t> ids;
      t->encode("Hello, wörld 123 世界 <|endoftext|> 🚀\t\n", ids, session);
    }
  } catch (const dstrain::Error&) {}
  return 0;
}
