#include "dstrain/text/chat_template_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <stdexcept>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/json_depth.h"

namespace dstrain::text {
namespace fs = std::filesystem;
namespace {

std::string token_text(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const auto& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}

// Strings are moved out of `j`: a long message is not held twice.
jinja::Value value_of(nlohmann::ordered_json& j) {
  using jinja::Dict;
  using jinja::List;
  using jinja::Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw std::invalid_argument(fmt::format("the number {} needs more than 64 bits", j.get<uint64_t>()));
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(std::move(j.get_ref<std::string&>()));
    case nlohmann::ordered_json::value_t::array: {
      List list;
      for (auto& e : j) list.push_back(value_of(e));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), value_of(it.value()));
      return Value(std::move(d));
    }
    default:
      return Value();
  }
}

}  // namespace

ChatTemplateSource read_chat_template(const std::string& path, const std::string& template_name) {
  if (!fs::exists(path))
    throw Error(ErrorCode::kConfig, fmt::format("'{}' does not exist", path),
                "pass a tokenizer directory (with tokenizer_config.json), its tokenizer_config.json, or a .jinja template file");
  const fs::path config_path = fs::is_directory(path) ? fs::path(path) / "tokenizer_config.json" : fs::path(path);
  ChatTemplateSource out;
  if (config_path.extension() != ".json") {  // a template file
    out.source = read_file(config_path.string());
    out.name = config_path.string();
    return out;
  }
  if (!fs::is_regular_file(config_path))
    throw Error(ErrorCode::kConfig, fmt::format("'{}' has no tokenizer_config.json", path), "pass --chat-template FILE with the template");
  nlohmann::json config;
  const std::string text = read_file(config_path.string());
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw Error(ErrorCode::kConfig, fmt::format("{}: JSON nested more than {} levels deep", config_path.string(), kMaxJsonDepth),
                "pass the model's own tokenizer_config.json");
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kConfig, fmt::format("{}: not valid JSON: {}", config_path.string(), e.what()), "");
  }
  out.bos_token = token_text(config, "bos_token");
  out.eos_token = token_text(config, "eos_token");
  out.name = config_path.string();
  const nlohmann::json t = config.value("chat_template", nlohmann::json());
  if (t.is_string()) {
    out.source = t.get<std::string>();
  } else if (t.is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
    std::string names;
    for (size_t i = 0; i < t.size(); ++i) {
      const nlohmann::json& entry = t[i];
      if (!entry.is_object() || !entry.contains("name") || !entry.at("name").is_string() || !entry.contains("template") ||
          !entry.at("template").is_string())
        throw Error(ErrorCode::kConfig,
                    fmt::format("{}: chat_template[{}] is not {{\"name\": a string, \"template\": a string}}", config_path.string(), i),
                    "pass the model's own tokenizer_config.json, or the template with --chat-template FILE");
      const std::string n = entry.at("name").get<std::string>();
      names += (names.empty() ? "" : ", ") + n;
      if (n == template_name) out.source = entry.at("template").get<std::string>(), out.name += " (" + n + ")";
    }
    if (out.source.empty())
      throw Error(ErrorCode::kConfig,
                  fmt::format("{}: no chat template named '{}' (it has: {})", config_path.string(), template_name, names), "");
  } else if (!t.is_null()) {
    throw Error(
        ErrorCode::kConfig,
        fmt::format("{}: chat_template is {}, not a template (a string) or a list of named templates", config_path.string(), t.type_name()),
        "pass the model's own tokenizer_config.json, or the template with --chat-template FILE");
  } else {
    // transformers >= 4.43 keeps it beside the config: chat_template.jinja
    const fs::path beside = config_path.parent_path() / "chat_template.jinja";
    if (!fs::is_regular_file(beside))
      throw Error(ErrorCode::kConfig,
                  fmt::format("{} has no chat_template (and there is no chat_template.jinja beside it)", config_path.string()),
                  "pass --chat-template FILE with the template the model was trained with");
    out.source = read_file(beside.string());
    out.name = beside.string();
  }
  return out;
}

void read_special_tokens(const std::string& tokenizer_dir, ChatTemplateSource& into) {
  const fs::path config_path = fs::path(tokenizer_dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(config_path)) return;
  const nlohmann::json config = nlohmann::json::parse(read_file(config_path.string()), nullptr, false);
  if (config.is_discarded()) throw Error(ErrorCode::kConfig, fmt::format("{}: not valid JSON", config_path.string()), "");
  into.bos_token = token_text(config, "bos_token");
  into.eos_token = token_text(config, "eos_token");
}

void write_chat_template_into(const std::string& tokenizer_dir, const ChatTemplateSource& source) {
  const fs::path config_path = fs::path(tokenizer_dir) / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::is_regular_file(config_path)) config = nlohmann::ordered_json::parse(read_file(config_path.string()), nullptr, false);
  if (!config.is_object()) config = nlohmann::ordered_json::object();  // read_chat_template refused a broken one already
  const auto has = [&](const char* key) { return config.contains(key) && !config.at(key).is_null(); };
  if (has("chat_template") && config.at("chat_template") == source.source) return;
  config["chat_template"] = source.source;
  if (!has("bos_token") && !source.bos_token.empty()) config["bos_token"] = source.bos_token;
  if (!has("eos_token") && !source.eos_token.empty()) config["eos_token"] = source.eos_token;
  if (!has("tokenizer_class")) config["tokenizer_class"] = "PreTrainedTokenizerFast";
  write_file_atomic(config_path.string(), config.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

jinja::Value chat_context(const std::string& text, const ChatTemplateSource& source, bool generation_prompt) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw std::invalid_argument(fmt::format("JSON nested more than {} levels deep (a conversation needs a few)", kMaxJsonDepth));
  nlohmann::ordered_json line = nlohmann::ordered_json::parse(text, nullptr, false);
  if (line.is_discarded()) throw std::invalid_argument("not valid JSON");
  if (!(line.is_array() || (line.is_object() && line.contains("messages") && line.at("messages").is_array())))
    throw std::invalid_argument("not a conversation (a JSON array of messages, or an object with \"messages\")");
  // Moved, never copied, from here on: a message's text is held once.
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (line.is_array())
    context["messages"] = std::move(line);
  else
    context = std::move(line);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (auto& m : context.at("messages")) {
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && m.is_object() && m.contains(key) && !m.at(key).is_null()) reasoning = &m.at(key);
    if (!m.is_object()) {
      messages.push_back(std::move(m));
      continue;
    }
    // apply_chat_template drops a message's keys whose value is None (transformers 5).
    nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
    const nlohmann::ordered_json reasoning_text = reasoning ? *reasoning : nlohmann::ordered_json();
    if (reasoning) aliased["thinking"] = reasoning_text;
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) aliased[it.key()] = std::move(it.value());
    if (reasoning) aliased["reasoning_content"] = reasoning_text;
    messages.push_back(std::move(aliased));
  }
  context["messages"] = std::move(messages);
  for (const char* key : {"tools", "documents"})
    if (!context.contains(key)) context[key] = nullptr;
  if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = generation_prompt;
  if (!context.contains("bos_token")) context["bos_token"] = source.bos_token;
  if (!context.contains("eos_token")) context["eos_token"] = source.eos_token;
  return value_of(context);
}

}  // namespace dstrain::text
