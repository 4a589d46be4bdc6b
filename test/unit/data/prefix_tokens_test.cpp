// Prefix token counts from the whole rendering's cuts (issue 55, D10): for random texts that share
// a random part of a whole rendering, PrefixTokens' count and common equal what encoding the text
// from its start gives, for byte-level tokenizers with added tokens matched in the raw text, in
// the normalized text, both (with a normalizer), and taking whitespace with lstrip/rstrip.
#include "catch_torch.h"

#include <random>
#include <string>
#include <vector>

#include "dstrain/data/prefix_tokens.h"
#include "dstrain/text/byte_level.h"
#include "dstrain/text/tokenizer.h"

using dstrain::text::Tokenizer;

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// Byte-level BPE over every byte, merges that cross what the added tokens cut, and `added`.
std::shared_ptr<const Tokenizer> tokenizer(const std::string& added, const std::string& normalizer) {
  std::string vocab;
  int id = 0;
  for (int b = 0; b < 256; ++b)
    vocab += (b ? "," : "") + quoted(dstrain::text::byte_level_encode(std::string(1, static_cast<char>(b)))) + ":" + std::to_string(id++);
  std::string merges;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"Ġ", "a"}, {"a", "b"}, {"Ġa", "b"}, {"<", "|"}, {"|", ">"}, {"Ċ", "Ċ"}, {"Ġ", "Ġ"}, {"ab", "ab"}, {"e", "n"}, {"en", "d"}}) {
    vocab += "," + quoted(a + b) + ":" + std::to_string(id++);
    merges += std::string(merges.empty() ? "" : ",") + "[" + quoted(a) + "," + quoted(b) + "]";
  }
  return Tokenizer::from_json(R"({"added_tokens": [)" + added + R"(], "normalizer": )" + normalizer +
                                  R"(, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "model": {"type": "BPE", "vocab": {)" +
                                  vocab + R"(}, "merges": [)" + merges + "]}}",
                              "t.json");
}

std::string token(int id, const std::string& content, bool normalized, bool lstrip = false, bool rstrip = false) {
  return R"({"id": )" + std::to_string(id) + R"(, "content": )" + quoted(content) + R"(, "special": true, "normalized": )" +
         (normalized ? "true" : "false") + R"(, "lstrip": )" + (lstrip ? "true" : "false") + R"(, "rstrip": )" +
         (rstrip ? "true" : "false") + "}";
}

std::string random_text(std::mt19937& rng, int pieces) {
  static const char* const kParts[] = {"<|im_start|>", "<|im_end|>", "<|end|>", "<|im", "_start|>", "<pad>", " <pad> ", "ab",
                                       "a b",          " ab",        "\n",      "\n\n", "  ",       "end",   "END",     "x"};
  std::string s;
  for (int i = 0; i < pieces; ++i) s += kParts[rng() % (sizeof(kParts) / sizeof(kParts[0]))];
  return s;
}

void check(const Tokenizer& t, uint32_t seed) {
  std::mt19937 rng(seed);
  Tokenizer::Session session;
  for (int round = 0; round < 60; ++round) {
    const std::string full = random_text(rng, 40);
    dstrain::data::PrefixTokens prefixes(t, session, full);
    for (int i = 0; i < 40; ++i) {
      const size_t shared = rng() % (full.size() + 1);
      // The tail: nothing, more of the whole rendering, or that and then something else.
      std::string tail = rng() % 3 == 0 ? "" : full.substr(shared, rng() % (full.size() - shared + 1));
      if (rng() % 2) tail += random_text(rng, 1 + static_cast<int>(rng() % 3));
      const std::string text = full.substr(0, shared) + tail;
      std::vector<uint32_t> expected;
      t.encode(text, expected, session, false);
      INFO("full: " << full << "\ntext: " << text);
      CHECK(prefixes.count(shared, tail) == expected.size());
      size_t common = 0;
      while (common < expected.size() && common < prefixes.ids().size() && expected[common] == prefixes.ids()[common]) ++common;
      CHECK(prefixes.common(shared, tail) == common);
    }
  }
}

}  // namespace

TEST_CASE("prefix tokens: counts from the cuts equal encoding from the start", "[data][prefix-tokens]") {
  const std::string specials = token(1000, "<|im_start|>", false) + "," + token(1001, "<|im_end|>", false);
  SECTION("added tokens in the raw text") { check(*tokenizer(specials, "null"), 1); }
  SECTION("added tokens in the normalized text") {
    check(
        *tokenizer(token(1000, "<|im_start|>", true) + "," + token(1001, "<|im_end|>", true) + "," + token(1002, "<|end|>", true), "null"),
        2);
  }
  SECTION("both, and a normalizer") {
    check(*tokenizer(specials + "," + token(1002, "<|end|>", true) + "," + token(1003, "end", true), R"({"type": "Lowercase"})"), 3);
  }
  SECTION("lstrip and rstrip take whitespace") {
    check(*tokenizer(specials + "," + token(1002, "<pad>", false, true, true) + "," + token(1003, "<|end|>", false, false, true), "null"),
          4);
  }
  SECTION("an added token that begins another") {
    check(*tokenizer(specials + "," + token(1002, "<|im", false) + "," + token(1003, "<|im_start|>x", false), "null"), 5);
  }
}
