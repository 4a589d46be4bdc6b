#pragma once
// One conversation -> its tokens and loss mask, through the model's own chat template. The tokens
// are those of the whole rendering (as apply_chat_template(tokenize=True) gives them: the template
// prints its own BOS, so no post-processor tokens are added). A trained message's span is found by
// incremental rendering: from the token count of messages[:i] with the generation prompt (for an
// assistant message; without it for others) to that of messages[:i+1], so the mask agrees with
// how the whole text tokenizes even where BPE merges across a role boundary.
// Mask value 1 at token t means "the model learns to predict token t".
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/data/conversation.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::data {

enum class TrainOn { kAssistant, kAll, kLastAssistant };
enum class Overlength { kDrop, kTruncate };

struct ChatEncodeOptions {
  TrainOn train_on = TrainOn::kAssistant;
  std::string end_of_turn;  // the token that ends an assistant turn; "": the template's eos_token
  int64_t max_length = 0;   // tokens per conversation; 0: no limit
  Overlength overlength = Overlength::kDrop;
  // The last assistant message written verbatim after the generation prompt, then the
  // end-of-turn token, instead of as the template renders it (for templates that cut it, as
  // R1's drops the reasoning before </think>).
  bool last_turn_verbatim = false;
};

enum class ChatOutcome { kKept, kTruncated, kTooLong, kNothingTrained };

struct EncodedChat {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  ChatOutcome outcome = ChatOutcome::kKept;
  bool rewrites_history = false;  // the template changed a trained message (its text is not in the rendering)
  bool doubled_bos = false;       // the rendering began with two BOS tokens; one was removed
};

class ChatEncoder {
 public:
  // Throws Error{kConfig}: a template outside the supported subset, or an end-of-turn string that
  // is not exactly one token of the vocabulary.
  ChatEncoder(text::ChatTemplateSource source, std::shared_ptr<const text::Tokenizer> tokenizer, ChatEncodeOptions options);
  ~ChatEncoder();
  // Thread-safe (one session per thread). Throws Error{kData} when the template refuses the
  // conversation (its raise_exception) and Error{kConfig} when a trained assistant turn does not
  // contain the end-of-turn token (the model would never learn to stop).
  // The conversation is taken (and its JSON released once read), so that a long message is not
  // held more times than it must be.
  void encode(Conversation conversation, EncodedChat& out, text::Tokenizer::Session& session) const;

  uint32_t end_of_turn_id() const { return end_of_turn_id_; }
  const std::string& end_of_turn() const { return options_.end_of_turn; }
  const text::ChatTemplateSource& source() const { return source_; }

 private:
  text::ChatTemplateSource source_;
  std::unique_ptr<text::ChatTemplate> template_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  ChatEncodeOptions options_;
  uint32_t end_of_turn_id_ = 0;
  int64_t bos_id_ = -1;
};

// Built-in templates, by name (--template NAME): deepseek-coder-finetune (DeepSeek-Coder's
// finetune_deepseekcoder.py format). Returns false for an unknown name.
bool builtin_chat_template(const std::string& name, text::ChatTemplateSource& out);

}  // namespace dstrain::data
