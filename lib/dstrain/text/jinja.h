#pragma once
// Chat templates (Hugging Face tokenizer_config.json `chat_template`), rendered as transformers'
// apply_chat_template renders them: Jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, loop controls, tojson without ASCII escapes, raise_exception and strftime_now,
// and the {% generation %} tag (its spans are reported). A construct outside the supported subset
// is refused at parse time with NAME:LINE:COLUMN.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/text/jinja/value.h"

namespace dstrain::text {

struct ChatRender {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;  // byte ranges rendered inside {% generation %}
};

class ChatTemplate {
 public:
  // Throws dstrain::Error{kConfig} "NAME:LINE:COLUMN: what" for a template it cannot render exactly.
  ChatTemplate(const std::string& source, const std::string& name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  // `context`: a dict (messages, add_generation_prompt, bos_token, eos_token, tools, ...; see
  // chat_template_file.h's chat_context).
  // Throws dstrain::Error{kData}: the template's raise_exception (its message), or an error
  // while rendering (an undefined value used, a type error), with NAME:LINE:COLUMN.
  ChatRender render(const jinja::Value& context) const;
  const std::string& name() const;
  // The steps one render may take (jinja/limits.h's kMaxRenderSteps unless set): the fuzzer
  // lowers it, so that a slow input is a refusal and not a time-out.
  void set_step_limit(int64_t steps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::text
