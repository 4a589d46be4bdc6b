#pragma once
// A Hugging Face tokenizer.json (the BPE model, byte-level or not), loaded once and then used
// from many threads. Token ids are those of the `tokenizers` package for the same file and text:
// added tokens, normalizer, pre-tokenizer, BPE and the post-processor's template, in that order.
// What dstrain does not implement is refused by name when loading, never approximated.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::text {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding one (as transformers saves it). Throws
  // Error{kData} naming the file and the key that is missing, malformed or not supported.
  static std::shared_ptr<const Tokenizer> load(const std::string& path);
  // The same from the text of a tokenizer.json; `name` stands for its path in messages.
  static std::shared_ptr<const Tokenizer> from_json(const std::string& json, const std::string& name);
  ~Tokenizer();

  // Per-thread working state (caches); one per thread that encodes.
  class Session {
   public:
    Session();
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    size_t dropped_characters() const;  // characters no token covered (tokenizers drops them too)
    struct Impl;

   private:
    friend class Tokenizer;
    std::unique_ptr<Impl> impl_;
  };

  // Appends the ids of `text` (valid UTF-8) as `tokenizers`' encode(text).ids gives them, with
  // the post-processor's special tokens (add_special_tokens=True), or without them (false: what
  // apply_chat_template(tokenize=True) does, since a chat template prints its own BOS).
  // `cuts` (optional): where the text splits after an added token. Another text that begins with
  // the same `byte` bytes, and either ends there or agrees with this one for longest_added_token()
  // bytes more, encodes as this text's first `ids` ids (after the post-processor's prefix) and
  // then the ids of its own rest encoded alone.
  struct TokenCut {
    size_t byte, ids;
  };
  void encode(std::string_view text, std::vector<uint32_t>& ids, Session& session, bool add_special_tokens = true,
              std::vector<TokenCut>* cuts = nullptr) const;
  // The text of `ids` (added tokens as their content), as the ByteLevel decoder (or, without a
  // decoder, the concatenation of the tokens) gives it. Throws for ids outside the vocabulary.
  // skip_special_tokens: added tokens marked special have no text (decode(skip_special_tokens=True)).
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  uint32_t vocab_size() const;         // the largest id plus one, added tokens included
  size_t longest_added_token() const;  // in bytes
  std::optional<uint32_t> token_id(std::string_view content) const;
  // The end-of-document token: the folder's tokenizer_config.json eos_token when there is one,
  // else the first of the usual names found (<|endoftext|>, </s>, DeepSeek's, Llama 3's).
  std::optional<uint32_t> default_end_of_document() const;

  const std::string& json_path() const;  // the tokenizer.json read
  const std::string& sha256() const;     // of that file's bytes
  // The tokenizer.json read, then the files transformers saves beside it (tokenizer_config.json,
  // special_tokens_map.json) where they exist.
  std::vector<std::string> files() const;
  std::string describe() const;  // one line: model, vocabulary, pre-tokenizer steps

  struct Impl;  // defined in tokenizer_impl.h, for the reader of tokenizer.json

 private:
  Tokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::text
