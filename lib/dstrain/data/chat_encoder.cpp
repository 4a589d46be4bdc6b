#include "dstrain/data/chat_encoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "dstrain/core/error.h"
#include "dstrain/data/prefix_tokens.h"

namespace dstrain::data {
namespace {

using text::jinja::Dict;
using text::jinja::List;
using text::jinja::Value;

// DeepSeek-Coder's finetune/finetune_deepseekcoder.py: build_instruction_prompt(instruction) as
// the source, f"{output}\n{EOT_TOKEN}" as the target; a first system message replaces its prompt.
// Later turns follow the model's own chat template's layout (the script has only one turn).
constexpr const char* kDeepSeekCoderFinetune =
    "{%- set default_system = 'You are an AI programming assistant, utilizing the DeepSeek Coder model, developed by DeepSeek "
    "Company, and you only answer questions related to computer science. For politically sensitive questions, security and "
    "privacy issues, and other non-computer science questions, you will refuse to answer.' -%}\n"
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "{{ messages[0]['content'] }}{% set turns = messages[1:] %}\n"
    "{%- else -%}\n"
    "{{ default_system }}{% set turns = messages %}\n"
    "{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- if message['role'] == 'user' -%}\n"
    "{{ '\\n### Instruction:\\n' + message['content'].strip() + '\\n### Response:\\n' }}\n"
    "{%- elif message['role'] == 'assistant' -%}\n"
    "{{ message['content'] + '\\n<|EOT|>' }}\n"
    "{%- else -%}\n"
    "{{ raise_exception('deepseek-coder-finetune has user and assistant turns after an optional system prompt, not ' + "
    "message['role']) }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The longest suffix of `prompt` that `content` begins with (R1's generation prompt ends with
// "<think>\n", which its data's reasoning begins with too).
size_t overlap(const std::string& prompt, std::string_view content) {
  for (size_t n = std::min(prompt.size(), content.size()); n > 0; --n)
    if (prompt.compare(prompt.size() - n, n, content, 0, n) == 0) return n;
  return 0;
}

bool trained_message(const Conversation& c, size_t i, TrainOn on, size_t last_assistant) {
  if (c.train[i] >= 0) return c.train[i] == 1;
  switch (on) {
    case TrainOn::kAll:
      return true;
    case TrainOn::kLastAssistant:
      return i == last_assistant;
    case TrainOn::kAssistant:
      break;
  }
  return c.roles[i] == "assistant";
}

}  // namespace

bool builtin_chat_template(const std::string& name, text::ChatTemplateSource& out) {
  if (name != "deepseek-coder-finetune") return false;
  out.source = kDeepSeekCoderFinetune;
  out.name = "built-in template deepseek-coder-finetune";
  return true;
}

ChatEncoder::ChatEncoder(text::ChatTemplateSource source, std::shared_ptr<const text::Tokenizer> tokenizer, ChatEncodeOptions options)
    : source_(std::move(source)), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  template_ = std::make_unique<text::ChatTemplate>(source_.source, source_.name);
  if (options_.end_of_turn.empty()) options_.end_of_turn = source_.eos_token;
  if (options_.end_of_turn.empty())
    throw Error(ErrorCode::kConfig, fmt::format("{} names no eos_token to end assistant turns with", source_.name),
                "pass the token that ends the template's assistant turns: --end-of-turn '<|im_end|>' (or <|eot_id|>, </s>, ...)");
  const auto id = tokenizer_->token_id(options_.end_of_turn);
  if (!id) {
    std::vector<uint32_t> pieces;
    text::Tokenizer::Session session;
    tokenizer_->encode(options_.end_of_turn, pieces, session, false);
    throw Error(ErrorCode::kConfig,
                fmt::format("the end-of-turn string '{}' is not one token of {}: it encodes as {} tokens, so a model trained on it "
                            "cannot learn to stop",
                            options_.end_of_turn, tokenizer_->json_path(), pieces.size()),
                "pass the tokenizer's real end-of-turn token with --end-of-turn, or add it to the tokenizer as a special token");
  }
  end_of_turn_id_ = *id;
  if (!source_.bos_token.empty())
    if (const auto bos = tokenizer_->token_id(source_.bos_token)) bos_id_ = *bos;
}

ChatEncoder::~ChatEncoder() = default;

void ChatEncoder::encode(Conversation c, EncodedChat& out, text::Tokenizer::Session& session) const {
  using Prefix = text::ChatTemplate::PrefixText;
  const Value context = text::chat_context(c.json, source_, false);
  std::string().swap(c.json);
  const size_t n = c.roles.size();
  // The messages' texts, as the context holds them (the conversation's own copies are released).
  std::vector<std::string_view> contents(n);
  const List& messages = context.as_dict().find("messages")->as_list();
  for (size_t i = 0; i < n && i < messages.size(); ++i)
    if (messages[i].kind() == Value::Kind::kDict)
      if (const Value* v = messages[i].as_dict().find("content"); v && v->is_string()) contents[i] = v->as_string();
  std::vector<std::string>().swap(c.contents);
  size_t last_assistant = n;
  for (size_t i = 0; i < n; ++i)
    if (c.roles[i] == "assistant") last_assistant = i;
  const bool verbatim = options_.last_turn_verbatim && last_assistant == n - 1;
  // --train-on all: every token, less the messages marked "train": false.
  const bool everything = options_.train_on == TrainOn::kAll;
  std::vector<bool> wanted(n + 1, false);  // the prefixes a trained message's span is found from
  for (size_t i = 0; i < n; ++i)
    if (trained_message(c, i, options_.train_on, last_assistant) != everything) wanted[i] = wanted[i + 1] = true;
  if (verbatim) wanted[n - 1] = true;
  const auto renders = template_->prefixes(context, wanted);
  const std::string& rendered = renders->full().text;
  std::string verbatim_text;  // what is tokenized: the rendering, or its verbatim last turn
  if (verbatim) {
    const Prefix p = renders->prefix(n - 1, true);
    const std::string prompt = rendered.substr(0, p.shared) + p.tail;
    verbatim_text = prompt;
    verbatim_text.append(contents[n - 1].substr(overlap(prompt, contents[n - 1]))).append(options_.end_of_turn);
  }
  const std::string& full = verbatim ? verbatim_text : rendered;
  // Prefixes come as bytes shared with the template's rendering; the tokens are those of `full`.
  const size_t agree = verbatim ? common_prefix(rendered, full) : rendered.size();
  const auto in_full = [&](Prefix p) {
    if (p.shared > agree) p.tail = rendered.substr(agree, p.shared - agree) + p.tail, p.shared = agree;
    return p;
  };
  out = EncodedChat();
  data::PrefixTokens tokens(*tokenizer_, session, full);
  std::vector<uint32_t>& ids = tokens.ids();
  const std::string& text = tokens.full();
  const auto is_prefix_of_full = [&](const Prefix& p) { return text.compare(p.shared, p.tail.size(), p.tail) == 0; };
  const auto bytes_in_common = [&](const Prefix& p) {
    return p.shared + common_prefix(p.tail, text.substr(p.shared, std::min(p.tail.size(), text.size() - p.shared)));
  };
  out.mask.assign(ids.size(), everything ? 1 : 0);
  for (size_t i = 0; i < n; ++i) {
    if (trained_message(c, i, options_.train_on, last_assistant) == everything) continue;
    const bool assistant = c.roles[i] == "assistant";
    const Prefix before = in_full(renders->prefix(i, assistant));
    const Prefix through = i + 1 == n ? Prefix{text.size(), ""} : in_full(renders->prefix(i + 1, false));
    if (!is_prefix_of_full(through)) {  // a later message changed how this one renders
      out.rewrites_history = true;
      continue;
    }
    const size_t through_end = through.shared + through.tail.size(), before_end = before.shared + before.tail.size();
    const bool prompt_is_prefix = before_end <= through_end && is_prefix_of_full(before);
    const size_t start = prompt_is_prefix ? before_end : std::min(bytes_in_common(before), through_end);
    if (assistant && !(verbatim && i + 1 == n) &&
        std::string_view(text).substr(start, through_end - start).find(text::jinja::python_strip_view(contents[i])) ==
            std::string_view::npos)
      out.rewrites_history = true;
    // Where the generation prompt is not how the turn begins (R1's "<think>\n"), the turn starts
    // after the tokens the two renderings share.
    const size_t a = prompt_is_prefix ? tokens.count(before.shared, before.tail) : tokens.common(before.shared, before.tail);
    const size_t b = i + 1 == n ? ids.size() : tokens.count(through.shared, through.tail);
    if (assistant && !everything &&
        std::find(ids.begin() + static_cast<std::ptrdiff_t>(std::min(a, b)), ids.begin() + static_cast<std::ptrdiff_t>(b),
                  end_of_turn_id_) == ids.begin() + static_cast<std::ptrdiff_t>(b))
      throw Error(ErrorCode::kConfig,
                  fmt::format("{} does not end assistant message {} with the end-of-turn token '{}' (id {}): a model trained on it "
                              "would not learn to stop",
                              source_.name, i, options_.end_of_turn, end_of_turn_id_),
                  "pass the token the template ends assistant turns with: --end-of-turn TOKEN");
    for (size_t t = a; t < b && t < out.mask.size(); ++t) out.mask[t] = everything ? 0 : 1;
  }
  out.tokens = std::move(ids);
  if (bos_id_ >= 0 && out.tokens.size() >= 2 && out.tokens[0] == static_cast<uint32_t>(bos_id_) && out.tokens[1] == out.tokens[0]) {
    out.tokens.erase(out.tokens.begin()), out.mask.erase(out.mask.begin());
    out.doubled_bos = true;
  }
  if (options_.max_length > 0 && static_cast<int64_t>(out.tokens.size()) > options_.max_length) {
    if (options_.overlength == Overlength::kDrop) {
      out.outcome = ChatOutcome::kTooLong;
      return;
    }
    out.tokens.resize(static_cast<size_t>(options_.max_length)), out.mask.resize(out.tokens.size());
    if (out.mask.back()) out.tokens.back() = end_of_turn_id_;  // a cut answer still ends its turn
    out.outcome = ChatOutcome::kTruncated;
  }
  if (std::find(out.mask.begin(), out.mask.end(), 1) == out.mask.end()) out.outcome = ChatOutcome::kNothingTrained;
}

}  // namespace dstrain::data
