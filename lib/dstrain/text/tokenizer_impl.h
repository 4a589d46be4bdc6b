#pragma once
// The parts of a loaded Tokenizer, shared by tokenizer.cpp (encoding) and tokenizer_json.cpp
// (reading tokenizer.json). Not for use elsewhere.
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dstrain/text/added_tokens.h"
#include "dstrain/text/bpe.h"
#include "dstrain/text/normalizer.h"
#include "dstrain/text/pre_tokenizer.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::text {

struct Tokenizer::Impl {
  std::string json_path, folder, sha256, describe;
  std::unique_ptr<Bpe> model;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;  // normalized=false / normalized=true tokens
  std::optional<Normalizer> normalizer;
  PreTokenizer pre_tokenizer;
  std::vector<uint32_t> prefix_ids, suffix_ids;             // the post-processor's template around $A
  bool byte_level = false;                                  // the model works on bytes (a ByteLevel pre-tokenizer)
  std::string decoder;                                      // the decoder's type ("" when none)
  std::unordered_map<std::string, uint32_t> content_to_id;  // vocabulary and added tokens
  uint32_t vocab_size = 0;
};

struct Tokenizer::Session::Impl {
  BpeScratch bpe;
  Pieces pieces, scratch;
  std::string normalized;
  std::vector<Piece> cut;
  size_t dropped = 0;
};

// Fills `impl` from the tokenizer.json text `json` (read from impl.json_path).
void parse_tokenizer_json(const std::string& json, Tokenizer::Impl& impl);

}  // namespace dstrain::text
