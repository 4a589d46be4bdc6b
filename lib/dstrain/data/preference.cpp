#include "dstrain/data/preference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/text/jinja.h"

namespace dstrain::data {
namespace {

using Json = nlohmann::ordered_json;

size_t common_prefix_length(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool is_messages(const Json& v) { return v.is_array() && !v.empty() && v.front().is_object(); }

// TRL's extract_prompt: the leading part chosen and rejected share (messages, or characters with
// a space before the split left to the completions). As TRL, when one is a prefix of the other
// the split falls before the shorter one's last element.
// (Copies: inserting "prompt" into the ordered object moves its other values.)
void extract_prompt(Json& row) {
  const Json chosen = row["chosen"], rejected = row["rejected"];
  if (chosen.is_string()) {
    const std::string c = chosen.get<std::string>(), r = rejected.get<std::string>();
    const size_t n = std::min(c.size(), r.size());
    if (n == 0) throw PreferenceError("without a \"prompt\", chosen and rejected must share one; one of them is empty");
    size_t idx = 0;
    while (idx < n && c[idx] == r[idx]) ++idx;
    if (idx == n) idx = n - 1;
    while (idx > 0 && (static_cast<unsigned char>(c[idx]) & 0xC0) == 0x80) --idx;  // a whole character (Python slices code points)
    if (idx > 0 && c[idx - 1] == ' ') --idx;
    row["chosen"] = c.substr(idx), row["rejected"] = r.substr(idx), row["prompt"] = c.substr(0, idx);
    return;
  }
  const size_t n = std::min(chosen.size(), rejected.size());
  if (n == 0) throw PreferenceError("without a \"prompt\", chosen and rejected must share one; one of them is empty");
  size_t idx = 0;
  // Messages compare as Python dicts do: by keys and values, not key order.
  while (idx < n && nlohmann::json(chosen[idx]) == nlohmann::json(rejected[idx])) ++idx;
  if (idx == n) idx = n - 1;
  Json prompt = Json::array(), c = Json::array(), r = Json::array();
  for (size_t i = 0; i < chosen.size(); ++i) (i < idx ? prompt : c).push_back(chosen[i]);
  for (size_t i = idx; i < rejected.size(); ++i) r.push_back(rejected[i]);
  row["chosen"] = std::move(c), row["rejected"] = std::move(r), row["prompt"] = std::move(prompt);
}

Json parse_row(const std::string& json) {
  Json row = Json::parse(json, nullptr, false);
  if (row.is_discarded()) throw PreferenceError("not valid JSON");
  if (!row.is_object()) throw PreferenceError("a preference row is a JSON object with \"chosen\" and \"rejected\"");
  for (const char* key : {"chosen", "rejected"})
    if (!row.contains(key) || row[key].is_null())
      throw PreferenceError(fmt::format("no \"{}\": a preference row has \"prompt\", \"chosen\" and \"rejected\" (TRL's format)", key));
  const bool conversational = is_messages(row["chosen"]) || (row.contains("prompt") && is_messages(row["prompt"]));
  for (const char* key : {"prompt", "chosen", "rejected"}) {
    if (!row.contains(key)) continue;
    const Json& v = row[key];
    if (conversational ? !(v.is_array() && std::all_of(v.begin(), v.end(), [](const Json& m) { return m.is_object(); })) : !v.is_string())
      throw PreferenceError(fmt::format("\"{}\" is {}: {}", key, v.type_name(),
                                        conversational ? "in a conversational row, prompt, chosen and rejected are lists of messages"
                                                       : "in a text row, prompt, chosen and rejected are strings"));
  }
  if (!row.contains("prompt")) extract_prompt(row);
  for (const char* key : {"chosen", "rejected"}) {  // TRL would train on the end-of-turn token alone
    const Json& v = row[key];
    const bool empty = v.is_string() ? v.get<std::string>().empty() : std::all_of(v.begin(), v.end(), [](const Json& m) {
      return !m.contains("content") || (m["content"].is_string() && m["content"].get<std::string>().empty());
    });
    if (empty) throw PreferenceError(fmt::format("the {} completion is empty: nothing to prefer", key));
  }
  return row;
}

// TRL's collator: each sequence cut to max_length, its start or its end kept.
void truncate(std::vector<uint32_t>& ids, std::vector<uint8_t>& mask, const PreferenceEncodeOptions& o, bool& cut) {
  const size_t max = static_cast<size_t>(o.max_length);
  if (o.max_length <= 0 || ids.size() <= max) return;
  cut = true;
  if (o.keep_end) {
    ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(max)),
        mask.erase(mask.begin(), mask.end() - static_cast<std::ptrdiff_t>(max));
  } else {
    ids.resize(max), mask.resize(max);
  }
}

// TRL's reward "margin" column, when the row has one (null counts as none).
std::optional<double> margin_of(const Json& row) {
  if (!row.contains("margin") || row["margin"].is_null()) return std::nullopt;
  const Json& m = row["margin"];
  if (!m.is_number() || !std::isfinite(m.get<double>()))
    throw PreferenceError(
        fmt::format("\"margin\" is {}: a finite number (how far the chosen score should be above the rejected one)", m.dump()));
  return m.get<double>();
}

}  // namespace

PreferenceEncoder::PreferenceEncoder(text::ChatTemplateSource source, std::shared_ptr<const text::Tokenizer> tokenizer,
                                     PreferenceEncodeOptions options)
    : source_(std::move(source)), tokenizer_(std::move(tokenizer)), options_(options) {
  if (!source_.source.empty()) template_ = std::make_unique<text::ChatTemplate>(source_.source, source_.name);
}

PreferenceEncoder::~PreferenceEncoder() = default;

std::vector<uint32_t> PreferenceEncoder::render_tokens(const std::string& messages_json, bool generation_prompt,
                                                       text::Tokenizer::Session& session) const {
  if (!template_)
    throw Error(ErrorCode::kConfig, "conversational preference rows need a chat template, and the tokenizer has none",
                "pass --chat-template FILE (a .jinja file or a tokenizer_config.json)");
  const std::string text = template_->render(text::chat_context(messages_json, source_, generation_prompt)).text;
  std::vector<uint32_t> ids;
  tokenizer_->encode(text, ids, session, false);  // apply_chat_template(tokenize=True): the template prints its own specials
  return ids;
}

EncodedPair PreferenceEncoder::encode(const std::string& json, text::Tokenizer::Session& session) const {
  Json row = parse_row(json);
  const std::optional<double> margin = margin_of(row);
  std::vector<uint32_t> prompt, chosen, rejected;
  if (row["prompt"].is_array()) {
    Json with_chosen = row["prompt"], with_rejected = row["prompt"];
    for (const Json& m : row["chosen"]) with_chosen.push_back(m);
    for (const Json& m : row["rejected"]) with_rejected.push_back(m);
    prompt = render_tokens(row["prompt"].dump(), true, session);
    chosen = render_tokens(with_chosen.dump(), false, session);
    rejected = render_tokens(with_rejected.dump(), false, session);
  } else {
    const std::string& eos = source_.eos_token;
    const auto with_eos = [&eos](std::string s) {
      if (eos.empty() || s.size() < eos.size() || s.compare(s.size() - eos.size(), eos.size(), eos) != 0) s += eos;
      return s;
    };
    const std::string p = row["prompt"].get<std::string>();
    tokenizer_->encode(p, prompt, session, true);  // tokenizer(text): with the post-processor's special tokens
    tokenizer_->encode(p + with_eos(row["chosen"].get<std::string>()), chosen, session, true);
    tokenizer_->encode(p + with_eos(row["rejected"].get<std::string>()), rejected, session, true);
  }
  const size_t prompt_len = std::min(common_prefix_length(prompt, chosen), common_prefix_length(prompt, rejected));
  if (chosen.size() == prompt_len || rejected.size() == prompt_len)
    throw PreferenceError(
        fmt::format("the {} completion is empty once tokenized: nothing to prefer", chosen.size() == prompt_len ? "chosen" : "rejected"));
  EncodedPair out;
  out.margin = margin;
  out.identical = chosen == rejected;
  if (options_.max_length > 0 && !options_.keep_end && static_cast<int64_t>(prompt_len) >= options_.max_length) {
    out.outcome = PairOutcome::kPromptTooLong;
    return out;
  }
  out.chosen_mask.assign(chosen.size(), 1), out.rejected_mask.assign(rejected.size(), 1);
  std::fill_n(out.chosen_mask.begin(), prompt_len, 0), std::fill_n(out.rejected_mask.begin(), prompt_len, 0);
  bool cut = false;
  truncate(chosen, out.chosen_mask, options_, cut);
  truncate(rejected, out.rejected_mask, options_, cut);
  out.chosen = std::move(chosen), out.rejected = std::move(rejected);
  if (cut) out.outcome = PairOutcome::kTruncated;
  return out;
}

struct PreferenceEncoder::ExampleFields {
  const Json& prompt;
  const Json& completion;
  bool desirable;
};

UnpairedExample PreferenceEncoder::encode_example(const ExampleFields& fields, text::Tokenizer::Session& session) const {
  const Json &prompt = fields.prompt, &completion = fields.completion;
  std::vector<uint32_t> prompt_ids, full;
  if (prompt.is_array()) {
    Json whole = prompt;
    for (const Json& m : completion) whole.push_back(m);
    prompt_ids = render_tokens(prompt.dump(), true, session);
    full = render_tokens(whole.dump(), false, session);
  } else {
    const std::string& eos = source_.eos_token;
    std::string c = completion.get<std::string>();
    if (!eos.empty() && (c.size() < eos.size() || c.compare(c.size() - eos.size(), eos.size(), eos) != 0)) c += eos;
    tokenizer_->encode(prompt.get<std::string>(), prompt_ids, session, true);
    tokenizer_->encode(prompt.get<std::string>() + c, full, session, true);
  }
  const size_t prompt_len = common_prefix_length(prompt_ids, full);
  if (full.size() == prompt_len) throw PreferenceError("the completion is empty once tokenized: nothing to learn from");
  UnpairedExample out;
  out.prompt.assign(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(prompt_len));
  out.completion.assign(full.begin() + static_cast<std::ptrdiff_t>(prompt_len), full.end());
  out.desirable = fields.desirable;
  return out;
}

UnpairedRow PreferenceEncoder::encode_unpaired(const std::string& json, text::Tokenizer::Session& session) const {
  Json row = Json::parse(json, nullptr, false);
  if (row.is_discarded()) throw PreferenceError("not valid JSON");
  UnpairedRow out;
  if (!row.is_object() || !(row.contains("completion") || row.contains("label"))) {
    row = parse_row(json);  // a pair: unpaired as TRL's unpair_preference_dataset
    out.paired = true;
    out.examples.push_back(encode_example({row["prompt"], row["chosen"], true}, session));
    out.examples.push_back(encode_example({row["prompt"], row["rejected"], false}, session));
    return out;
  }
  for (const char* key : {"prompt", "completion", "label"})
    if (!row.contains(key) || row[key].is_null())
      throw PreferenceError(fmt::format("no \"{}\": an unpaired row has \"prompt\", \"completion\" and \"label\" (TRL's KTO format)", key));
  if (!row["label"].is_boolean())
    throw PreferenceError(fmt::format("\"label\" is {}: true (a desirable completion) or false", row["label"].dump()));
  const bool conversational = is_messages(row["prompt"]) || is_messages(row["completion"]);
  for (const char* key : {"prompt", "completion"}) {
    const Json& v = row[key];
    if (conversational ? !(v.is_array() && std::all_of(v.begin(), v.end(), [](const Json& m) { return m.is_object(); })) : !v.is_string())
      throw PreferenceError(fmt::format("\"{}\" is {}: {}", key, v.type_name(),
                                        conversational ? "in a conversational row, prompt and completion are lists of messages"
                                                       : "in a text row, prompt and completion are strings"));
  }
  if (row["completion"].empty()) throw PreferenceError("the completion is empty: nothing to learn from");
  out.examples.push_back(encode_example({row["prompt"], row["completion"], row["label"].get<bool>()}, session));
  return out;
}

}  // namespace dstrain::data
