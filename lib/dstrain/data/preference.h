#pragma once
// One preference row -> the token ids of its prompt, chosen and rejected completions, exactly as
// TRL 1.16's DPOTrainer tokenizes them (trainer/dpo_trainer.py, tokenize_fn and the collator):
//   rows      {"prompt", "chosen", "rejected"}: each a list of messages (conversational) or a
//             string; without "prompt", chosen and rejected are whole conversations (or texts)
//             and the prompt is their common prefix (TRL's extract_prompt)
//   tokens    conversational: apply_chat_template(prompt, add_generation_prompt=True) and the
//             templates of prompt + chosen and prompt + rejected, rendered whole; text:
//             tokenizer(prompt) and tokenizer(prompt + completion + eos), eos appended unless the
//             completion ends with it. The completion starts where the tokenized prompt and each
//             whole diverge (the shorter common prefix of the two), so a token merged across the
//             boundary is cut as TRL cuts it
//   length    max_length > 0: each of prompt + chosen and prompt + rejected cut to max_length,
//             its start kept (keep_start, dropping a pair whose prompt alone fills max_length, as
//             TRL does) or its end (keep_end)
// A prepared set holds each pair as two documents, prompt + chosen then prompt + rejected, with a
// loss mask over the completion tokens (prepare-data --preference).
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::text {
class ChatTemplate;
}
namespace dstrain::data {

struct PreferenceEncodeOptions {
  int64_t max_length = 0;  // tokens per sequence (prompt + completion); 0: no limit
  bool keep_end = false;   // TRL's truncation_mode keep_end (default keep_start)
};

enum class PairOutcome { kKept, kTruncated, kPromptTooLong };

struct EncodedPair {
  std::vector<uint32_t> chosen, rejected;           // prompt + completion, each
  std::vector<uint8_t> chosen_mask, rejected_mask;  // 1 over the completion's tokens
  PairOutcome outcome = PairOutcome::kKept;
  bool identical = false;  // chosen and rejected are the same tokens (no preference to learn)
  // The row's "margin" (a number: how much the chosen completion should score above the rejected
  // one, TRL's reward margin), when it has one.
  std::optional<double> margin;
};

// One example of an unpaired set (train.objective kto), as TRL 1.16's KTOTrainer tokenizes it
// (trainer/kto_trainer.py, tokenize_fn): the prompt's tokens up to where they and those of
// prompt + completion diverge, and the completion's tokens after, untruncated.
struct UnpairedExample {
  std::vector<uint32_t> prompt, completion;
  bool desirable = true;
};

// A row of a --kto input: {prompt, completion, label} is one example; a pair ({prompt, chosen,
// rejected}, the prompt extracted as for DPO when absent) is two, the chosen one desirable.
struct UnpairedRow {
  std::vector<UnpairedExample> examples;
  bool paired = false;
};

// A malformed row: what is wrong, without the file and line (the caller adds them).
struct PreferenceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class PreferenceEncoder {
 public:
  // `source` is the chat template of conversational rows (unused for text rows).
  PreferenceEncoder(text::ChatTemplateSource source, std::shared_ptr<const text::Tokenizer> tokenizer, PreferenceEncodeOptions options);
  ~PreferenceEncoder();
  // Thread-safe (one session per thread). Throws PreferenceError for a row that is not a pair (a
  // missing or mistyped field, prompt and completions of different kinds, an empty completion)
  // and Error{kData} when the chat template refuses it.
  EncodedPair encode(const std::string& json, text::Tokenizer::Session& session) const;
  // The same for a --kto row (no truncation: the set's assembly cuts, data/kto_set.h).
  UnpairedRow encode_unpaired(const std::string& json, text::Tokenizer::Session& session) const;
  const text::ChatTemplateSource& source() const { return source_; }

 private:
  struct ExampleFields;  // a row's prompt and completion, parsed
  UnpairedExample encode_example(const ExampleFields& fields, text::Tokenizer::Session& session) const;
  std::vector<uint32_t> render_tokens(const std::string& messages_json, bool generation_prompt, text::Tokenizer::Session& session) const;

  text::ChatTemplateSource source_;
  std::unique_ptr<text::ChatTemplate> template_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  PreferenceEncodeOptions options_;
  uint32_t eos_id_ = 0;
  bool has_eos_ = false;
};

}  // namespace dstrain::data
