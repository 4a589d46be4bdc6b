#pragma once
// Prompts for generation as token ids, the way transformers makes them: text as tokenizer(TEXT)
// (the tokenizer's special tokens, its BOS, included); a conversation through the chat template
// with its generation prompt (apply_chat_template(add_generation_prompt=True, tokenize=True)); or,
// for a byte-level model (no tokenizer), the text's UTF-8 bytes. And the other way: token ids to
// text, invalid UTF-8 as U+FFFD (transformers' decode).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::text {
class Tokenizer;
}

namespace dstrain::data {

class PromptCodec {
 public:
  // `tokenizer_dir`: a folder with tokenizer.json (and tokenizer_config.json's chat template), or
  // "" for bytes (end_of_document: the byte-level model's end-of-document id, -1 for none).
  explicit PromptCodec(const std::string& tokenizer_dir, int64_t end_of_document = -1);
  ~PromptCodec();
  PromptCodec(const PromptCodec&) = delete;
  PromptCodec& operator=(const PromptCodec&) = delete;

  // add_special_tokens false: the text alone (lm-eval's for a text that starts with the BOS's text).
  std::vector<int64_t> encode_text(const std::string& text, bool add_special_tokens = true) const;
  // `json`: a list of messages, or an object with "messages". Throws Error{kConfig} without a chat
  // template (a byte-level model has none).
  std::vector<int64_t> encode_messages(const std::string& json);
  // skip_special_tokens: special added tokens have no text, as lm-eval decodes generations.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;
  // The end of sequence: the tokenizer's (tokenizer_config.json's eos_token), or the byte-level
  // model's end of document; -1 when there is none.
  int64_t end_of_sequence() const;
  const std::string& tokenizer_dir() const;
  // The loaded tokenizer, for others to share; null for bytes.
  std::shared_ptr<const text::Tokenizer> tokenizer() const;
  int64_t vocab_size() const;  // the tokenizer's (257 or 256 for bytes)
  // The text of the tokenizer's BOS token (tokenizer_config.json's bos_token), "" without one.
  std::string bos_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct Prompt {
  std::string where;  // FILE:LINE
  std::string shown;  // the prompt as a person reads it: the text, or the conversation's JSON
  std::vector<int64_t> ids;
};
// A JSON Lines file of {"prompt": TEXT} or {"messages": [...]} (blank lines skipped). Throws
// Error{kData} naming the line that is neither, Error{kUsage} when the file cannot be read.
std::vector<Prompt> read_prompts(const std::string& path, PromptCodec& codec);

}  // namespace dstrain::data
