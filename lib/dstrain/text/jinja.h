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

  // A rendering that begins with the first `shared` bytes of the whole conversation's.
  struct PrefixText {
    size_t shared = 0;
    std::string tail;
  };
  // The renderings of a conversation's prefixes (its first k messages), without rendering the
  // history again for each: the whole conversation is rendered once, and a prefix resumes that
  // render where a top-level loop over the messages reached message k, when nothing rendered
  // before that point depended on message k or later (jinja/prefix_tracker.h says when). A
  // prefix it cannot prove that for is rendered from the start. Either way the text is exactly
  // render() of the context with messages[:k] and add_generation_prompt as asked.
  class PrefixRenders {
   public:
    ~PrefixRenders();
    const ChatRender& full() const;  // render(context)
    // Throws as render() does.
    PrefixText prefix(size_t k, bool generation_prompt);
    size_t resumed() const;   // prefixes resumed so far
    size_t rendered() const;  // prefixes rendered from the start so far

   private:
    friend class ChatTemplate;
    PrefixRenders();
    struct Impl;
    std::unique_ptr<Impl> impl_;
  };
  // `wanted[k]`: the prefixes of k messages that will be asked for. Throws as render() does.
  std::unique_ptr<PrefixRenders> prefixes(const jinja::Value& context, const std::vector<bool>& wanted) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::text
