// Fuzzes the chat path (issue 55) with hostile input of two kinds:
//  - a template (first byte even): parsed and rendered over a small conversation with tools, as a
//    downloaded tokenizer_config.json would bring it;
//  - a conversation line (first byte odd): read in any layout (OpenAI, ShareGPT, Alpaca), turned
//    into the context transformers passes, and rendered with real templates (the DeepSeek V3,
//    Llama 3 and ChatML styles of test/fixtures/chat_templates).
// A clean Error (or a conversation refused as malformed) is fine; a crash, a sanitizer report, a
// hang or an allocation past libFuzzer's limits is a bug. The render's step bound is lowered to
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const dstrain::text::ChatTemplateSource source{rest, "fuzzed.jinja", "<s>", "</s>"};
      dstrain::text::ChatTemplate t(rest, "fuzzed.jinja");
      t.set_step_limit(kFuzzSteps);
      t.render(*context_of(kContext, source, true));
    } else {
      const auto c = dstrain::data::parse_conversation(rest, dstrain::data::ChatFormat::kAuto, dstrain::data::ChatFields{});
      for (auto& t : real_templates())
        if (const auto context = context_of(c.json, t.source, data[0] % 4 == 1)) t.compiled.render(*context);
    }
  } catch (const dstrain::Error&) {
  } catch (const dstrain::data::ConversationError&) {}
  return 0;
}
