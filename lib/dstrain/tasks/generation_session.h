#pragma once
// What `dstrain generate` and `dstrain chat` share: the target's model on one device (tasks/
// eval_target.h resolves it, tasks/target_weights.h reads its weights, a LoRA run's adapters
// included), its tokenizer and chat template, the stop ids, and a batch of prompts run through
// model::generate with stop strings and the first row's text streamed as it comes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/model/generation.h"

namespace dstrain::data {
class PromptCodec;
}
namespace dstrain::tasks {

struct GenerateRequest {
  std::string target, step;          // as dstrain eval's
  std::string tokenizer;             // "": the target's (tasks::target_tokenizer_dir)
  std::vector<std::string> prompts;  // --prompt TEXT (repeatable)
  std::string prompts_file;          // --prompts FILE: JSON Lines {"prompt": TEXT} or {"messages": [...]}
  std::vector<std::string> stop;     // stop strings: the text ends before the first
  std::vector<int64_t> stop_ids;     // besides the tokenizer's end of sequence
  std::string device = "auto";       // auto (a GPU when there is one), cpu, cuda, cuda:N
  std::string dtype;                 // "": the run's precision.dtype (a folder: fp32 on CPU, bf16 on a GPU)
  int64_t batch_size = 8;            // prompts per forward
  bool json = false;
  bool stream = false;  // print the text as it comes (one prompt at a time)
  model::GenerateOptions options;
};

// A folder's generation_config.json eos_token_id(s) within the vocabulary (none without the file).
std::vector<int64_t> generation_config_eos(const std::string& folder, int64_t vocab);

class GenerationSession {
 public:
  // `command` names the caller in messages ("dstrain generate"). Throws dstrain::Error for a bad
  // target, flag or tokenizer.
  GenerationSession(const GenerateRequest& request, const std::string& command);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // transformers' tokenizer(TEXT): with the tokenizer's special tokens (its BOS).
  std::vector<int64_t> encode_text(const std::string& text) const;
  // A conversation (JSON: a list of messages, or an object with "messages") through the chat
  // template with its generation prompt, as apply_chat_template(add_generation_prompt=True,
  // tokenize=True). Throws dstrain::Error{kConfig} when the tokenizer has no template.
  std::vector<int64_t> encode_messages(const std::string& json);
  // The tokens' text, invalid UTF-8 as U+FFFD (transformers' decode).
  std::string decode(const std::vector<int64_t>& ids) const;
  data::PromptCodec& codec();  // the three above
  // A row's text: a final stop id left out, cut before the first stop string.
  std::string text_of(const model::Generation& generation) const;

  struct Batch {
    std::vector<model::Generation> rows;
    double seconds = 0;
    std::string streamed;  // what was printed while generating (stream only)
  };
  // stream: the first row's text is printed to stdout as it comes (held back where a character
  // or a stop string may be unfinished).
  Batch run(const std::vector<std::vector<int64_t>>& prompts, bool stream);

  int64_t context() const;  // the model's positions (max_seq_len)
  int64_t max_new_tokens() const;
  std::string describe() const;  // "<target> on <device> (<dtype>, key/value cache)"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::tasks
