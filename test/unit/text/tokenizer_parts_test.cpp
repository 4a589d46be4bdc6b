// The tokenizer's parts on cases small enough to check by hand; the whole against Hugging Face
// tokenizers is test/text/tokenizer_test.sh.
#include <filesystem>
#include <fstream>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/text/bpe.h"
#include "dstrain/text/byte_level.h"
#include "dstrain/text/pre_tokenizer.h"
#include "dstrain/text/regex.h"
#include "dstrain/text/tokenizer.h"
#include "dstrain/text/utf8.h"

using namespace dstrain::text;

namespace {

std::vector<std::string> cut(const PreTokenizer& p, const std::string& text) {
  std::vector<std::string> out;
  p.for_each_piece(text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

std::vector<std::string> split_dash(SplitBehavior behavior, bool invert = false) {
  PreTokenizer p;
  PreTokenizerStep step;
  step.literal = "-";
  step.behavior = behavior;
  step.invert = invert;
  p.add(step);
  return cut(p, "the-final--countdown");
}

}  // namespace

TEST_CASE("Split behaviors cut as Hugging Face documents them", "[text]") {
  using V = std::vector<std::string>;
  CHECK(split_dash(SplitBehavior::kRemoved) == V{"the", "final", "countdown"});
  CHECK(split_dash(SplitBehavior::kIsolated) == V{"the", "-", "final", "-", "-", "countdown"});
  CHECK(split_dash(SplitBehavior::kMergedWithPrevious) == V{"the-", "final-", "-", "countdown"});
  CHECK(split_dash(SplitBehavior::kMergedWithNext) == V{"the", "-final", "-", "-countdown"});
  CHECK(split_dash(SplitBehavior::kContiguous) == V{"the", "-", "final", "--", "countdown"});
  CHECK(split_dash(SplitBehavior::kRemoved, true) == V{"-", "-", "-"});
}

TEST_CASE("Digits and ByteLevel's GPT-2 regex with add_prefix_space", "[text]") {
  PreTokenizer p;
  PreTokenizerStep digits;
  digits.kind = PreTokenizerStep::Kind::kDigits;
  digits.individual_digits = true;
  p.add(digits);
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  byte_level.add_prefix_space = true;
  byte_level.regex = std::make_shared<Regex>(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  p.add(byte_level);
  // Each digit is its own piece, and ByteLevel puts a space before every piece.
  CHECK(cut(p, "ab12 it's") == std::vector<std::string>{" ab", " 1", " 2", " it", "'s"});
}

TEST_CASE("Regex: empty matches right after a match are skipped, as the onig crate does", "[text]") {
  Regex r("x*");
  std::vector<ByteRange> m;
  r.find_all("axb", m);
  CHECK(m == std::vector<ByteRange>{{0, 0}, {1, 2}, {3, 3}});
  m.clear();
  Regex unicode(R"(\p{Han}+|\p{N}+)");
  unicode.find_all("ab世界12", m);
  CHECK(m == std::vector<ByteRange>{{2, 8}, {8, 10}});
  CHECK_THROWS_AS(Regex("(unclosed"), dstrain::Error);
}

TEST_CASE("BPE merges the lowest rank first and honours ignore_merges", "[text]") {
  const std::unordered_map<std::string, uint32_t> vocab{{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  BpeScratch scratch;
  size_t dropped = 0;
  std::vector<uint32_t> ids;
  Bpe ab_first(vocab, {{"a", "b"}, {"ab", "c"}}, {});
  ab_first.encode("abc", ids, scratch, dropped);
  CHECK(ids == std::vector<uint32_t>{5});
  ids.clear();
  BpeScratch fresh;
  Bpe bc_first(vocab, {{"b", "c"}, {"a", "b"}}, {});
  bc_first.encode("abcab", ids, fresh, dropped);
  CHECK(ids == std::vector<uint32_t>{0, 4, 3});  // a bc ab: "abc" is not reachable from (a, bc)
  ids.clear();
  BpeConfig ignore;
  ignore.ignore_merges = true;
  Bpe whole(vocab, {{"b", "c"}}, ignore);
  BpeScratch third;
  whole.encode("abc", ids, third, dropped);
  CHECK(ids == std::vector<uint32_t>{5});  // in the vocabulary as a whole: no merges needed
  ids.clear();
  whole.encode("abd", ids, third, dropped);  // 'd' has no token and no fallback: dropped
  CHECK(ids == std::vector<uint32_t>{0, 1});
  CHECK(dropped == 1);
  CHECK_THROWS_AS(Bpe(vocab, {{"c", "a"}}, {}), dstrain::Error);  // "ca" is not in the vocabulary
}

TEST_CASE("Byte-level alphabet and UTF-8 repair", "[text]") {
  CHECK(byte_level_encode(" \n") == "\xC4\xA0\xC4\x8A");  // Ġ Ċ
  CHECK(byte_level_decode("\xC4\xA0hi") == std::optional<std::string>(" hi"));
  CHECK(!byte_level_decode("\xE4\xB8\x96").has_value());  // 世 is not in the alphabet
  for (int b = 0; b < 256; ++b)
    CHECK(byte_level_decode(byte_level_encode(std::string(1, static_cast<char>(b)))) == std::string(1, static_cast<char>(b)));
  std::string valid = "héllo 世界 🚀";
  CHECK(repair_utf8(valid) == 0);
  std::string bad =
      "a\xFF"
      "b\xE4\xB8"
      "c\xED\xA0\x80";  // a stray byte, a truncated 世, a surrogate
  CHECK(repair_utf8(bad) == 5);
  CHECK(bad ==
        "a\xEF\xBF\xBD"
        "b\xEF\xBF\xBD"
        "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(is_unicode_whitespace(0x3000));
  CHECK(!is_unicode_whitespace(0x180E));
  CHECK(is_unicode_numeric(0x0663));  // Arabic-Indic three
  CHECK(is_unicode_numeric(0x00BD));  // ½ (No)
}

TEST_CASE("tokenizer.json: ByteLevel must be the last pre-tokenizer; the template wraps the ids unless told not to", "[text]") {
  const auto dir = std::filesystem::temp_directory_path() / "dstrain-tokenizer-unit";
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& pre) {
    std::ofstream(dir / "tokenizer.json") << R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true, "normalized": false}],
      "pre_tokenizer": )" << pre << R"(, "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [3], "tokens": ["<s>"]}}},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})";
  };
  write(R"({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "use_regex": false}, {"type": "Digits"}]})");
  CHECK_THROWS_WITH(Tokenizer::load(dir.string()), Catch::Contains("ByteLevel is followed by other pre-tokenizers"));
  write(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})");
  const auto t = Tokenizer::load(dir.string());
  Tokenizer::Session session;
  std::vector<uint32_t> ids;
  t->encode("ab<s>ba", ids, session);
  CHECK(ids == std::vector<uint32_t>{3, 2, 3, 1, 0});
  std::vector<uint32_t> chat;
  t->encode("<s>ab", chat, session, /*add_special_tokens=*/false);  // a chat template's own BOS, and no second one
  CHECK(chat == std::vector<uint32_t>{3, 2});
  CHECK(t->vocab_size() == 4);
  CHECK(t->decode(ids) == "<s>ab<s>ba");
  std::filesystem::remove_all(dir);
}

TEST_CASE("tokenizer.json: ids and nesting are checked before anything is allocated (issue 55, D11)", "[text]") {
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]})";
  // A 10 KB file with an id of 2^31-1 asked for a 64 GB table.
  CHECK_THROWS_WITH(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2147483647}, "merges": []}})", "t"),
                    Catch::Contains("model.vocab.b: is not a token id (0 to 16777215"));
  CHECK_THROWS_WITH(
      Tokenizer::from_json(R"({"added_tokens": [{"id": 2147483647, "content": "<s>", "special": true}], )" + model + "}", "t"),
      Catch::Contains("is not a token id (0 to 16777215)"));
  // Normalizers nested 100,000 deep: memory was quadratic in the depth, and the recursion unbounded.
  const std::string nested = R"({"type": "Lowercase"})";
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "Sequence", "normalizers": [)";
  deep += nested;
  for (int i = 0; i < 100000; ++i) deep += "]}";
  CHECK_THROWS_WITH(Tokenizer::from_json(R"({"normalizer": )" + deep + ", " + model + "}", "t"),
                    Catch::Contains("nests JSON more than 128 levels deep"));
  // A real tokenizer's nesting and ids load.
  CHECK(
      Tokenizer::from_json(R"({"normalizer": {"type": "Sequence", "normalizers": [)" + nested + "]}, " + model + "}", "t")->vocab_size() ==
      3);
}
