#pragma once
// Where a chat template comes from: a tokenizer directory or its tokenizer_config.json
// (`chat_template`: a string, or a list of named templates, "default" first), or a template file
// (.jinja). The tokenizer's bos_token and eos_token come with it: templates print them.
#include <string>

#include "dstrain/text/jinja/value.h"

namespace dstrain::text {

struct ChatTemplateSource {
  std::string source;  // the template text
  std::string name;    // for messages: the file, and the template's name when it has one
  std::string bos_token, eos_token;
};

// Throws dstrain::Error{kConfig} naming the file when there is no template or the JSON is malformed.
ChatTemplateSource read_chat_template(const std::string& path, const std::string& template_name = "default");

// Only the bos_token and eos_token of a tokenizer directory's tokenizer_config.json (empty when it
// has none), for a template that comes from elsewhere.
void read_special_tokens(const std::string& tokenizer_dir, ChatTemplateSource& into);

// Makes `tokenizer_dir`'s tokenizer_config.json (written when missing) carry `source` as its
// chat_template (a string: a list of named templates becomes the one used), and its bos/eos
// tokens where it names none: the copy of a tokenizer that a fine-tuning set was rendered with,
// so that a model exported from it ships the template it was trained on. Atomic.
void write_chat_template_into(const std::string& tokenizer_dir, const ChatTemplateSource& source);

// What transformers' apply_chat_template passes a template for one conversation: `line` is the
// JSON text of an array of messages, or an object with "messages" and other variables; tools and documents
// default to none, add_generation_prompt to `generation_prompt`, the special tokens to the
// tokenizer's; a message's keys whose value is null are dropped (as transformers 5 drops None);
// a message's reasoning (reasoning_content, thinking or reasoning) is given under
// "thinking" and "reasoning_content" as well (transformers 5). Throws std::invalid_argument for
// a line that is not JSON or neither.
jinja::Value chat_context(const std::string& line, const ChatTemplateSource& source, bool generation_prompt);

}  // namespace dstrain::text
