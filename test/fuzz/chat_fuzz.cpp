// Fuzzes the chat path (issue 55) with hostile input of two kinds:
//  - a template (first byte even): parsed and rendered over a small conversation with tools, as a
//    downloaded tokenizer_config.json would bring it;
//  - a conversation line (first byte odd): read in any layout (OpenAI, ShareGPT, Alpaca), turned
//    into the context transformers passes, and rendered with real templates (the DeepSeek V3,
//    Llama 3 and ChatML styles of test/fixtures/chat_templates).
// A clean Error (or a conversation refused as malformed) is fine; a crash, a sanitizer report, a
// hang, an allocation past libFuzzer's limits, or a resumed prefix rendering that differs from its
// render from the start (a std::logic_error, uncaught) is a bug. The render's step bound is lowered to
// 200,000 so that a slow template is a refusal here rather than a time-out.
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/data/conversation.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"

namespace {

constexpr int64_t kFuzzSteps = 200'000;

const char* kContext =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 世界"},)"
    R"( {"role": "assistant", "content": "Hello", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},)"
    R"( {"role": "tool", "content": "42"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})";

std::string read_fixture(const std::string& name) {
  std::ifstream in(std::string(DSTRAIN_FIXTURES) + "/" + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Template {
  dstrain::text::ChatTemplateSource source;
  dstrain::text::ChatTemplate compiled;
};

std::vector<Template>& real_templates() {
  static std::vector<Template> all = [] {
    std::vector<Template> out;
    for (const char* name : {"deepseek-v3-style.jinja", "llama3-style.jinja", "chatml-qwen-style.jinja"}) {
      dstrain::text::ChatTemplateSource source{read_fixture(name), name, "<s>", "</s>"};
      dstrain::text::ChatTemplate compiled(source.source, name);
      compiled.set_step_limit(kFuzzSteps);
      out.push_back({source, std::move(compiled)});
    }
    return out;
  }();
  return all;
}

// The context transformers would pass; nullopt for what chat_context refuses (not a
// conversation, nested too deep). Only there is std::invalid_argument an answer: escaping a render,
// it would be an "internal error" in dstrain.
std::optional<dstrain::text::jinja::Value> context_of(const std::string& json, const dstrain::text::ChatTemplateSource& source,
                                                      bool prompt) {
  try {
    return dstrain::text::chat_context(json, source, prompt);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

// Every resumed prefix equals a render from the start (ChatTemplate::prefixes). A resumed prefix
// may count more steps (those the whole render spent on later messages before resuming), so a
// step refusal there where the render from the start finished is not a finding.
void check_prefixes(const dstrain::text::ChatTemplate& t, const dstrain::text::jinja::Value& context) {
  using dstrain::text::jinja::Dict;
  using dstrain::text::jinja::List;
  using dstrain::text::jinja::Value;
  const Value* messages = context.as_dict().find("messages");
  const size_t n = messages && messages->kind() == Value::Kind::kList ? messages->as_list().size() : 0;
  const auto prefixes = t.prefixes(context, std::vector<bool>(n + 1, true));
  for (size_t k = 0; k <= n; ++k) {
    for (const bool prompt : {false, true}) {
      Dict d;
      for (const auto& [key, value] : context.as_dict().items())
        d.set(key, key == "messages"
                       ? Value(List(messages->as_list().begin(), messages->as_list().begin() + static_cast<std::ptrdiff_t>(k)))
                       : value);
      d.set("add_generation_prompt", Value(prompt));
      std::optional<std::string> exact, resumed;
      std::string refusal;
      try {
        exact = t.render(Value(d)).text;
      } catch (const dstrain::Error&) {}
      try {
        const auto p = prefixes->prefix(k, prompt);
        resumed = prefixes->full().text.substr(0, p.shared) + p.tail;
      } catch (const dstrain::Error& e) {
        refusal = e.what();
      }
      if (exact && !resumed && refusal.find("steps") != std::string::npos) continue;
      if (exact != resumed) throw std::logic_error("a resumed prefix differs from its render from the start");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const dstrain::text::ChatTemplateSource source{rest, "fuzzed.jinja", "<s>", "</s>"};
      dstrain::text::ChatTemplate t(rest, "fuzzed.jinja");
      t.set_step_limit(kFuzzSteps);
      const auto context = *context_of(kContext, source, true);
      t.render(context);
      check_prefixes(t, context);
    } else {
      const auto c = dstrain::data::parse_conversation(rest, dstrain::data::ChatFormat::kAuto, dstrain::data::ChatFields{});
      for (auto& t : real_templates())
        if (const auto context = context_of(c.json, t.source, data[0] % 4 == 1)) {
          t.compiled.render(*context);
          check_prefixes(t.compiled, *context);
        }
    }
  } catch (const dstrain::Error&) {
  } catch (const dstrain::data::ConversationError&) {}
  return 0;
}
