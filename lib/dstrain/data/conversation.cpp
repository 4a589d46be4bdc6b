#include "dstrain/data/conversation.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/core/json_depth.h"

namespace dstrain::data {
namespace {

using Json = nlohmann::ordered_json;

// "an array", "a string": a JSON value's kind with its article.
std::string kind(const Json& j) {
  const std::string name = j.type_name();
  if (j.is_null()) return name;
  return (name == "array" || name == "object" ? "an " : "a ") + name;
}

[[noreturn]] void malformed(const std::string& what) { throw ConversationError(what); }

void check_depth(const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    malformed(fmt::format("JSON nested more than {} levels deep (a conversation needs a few)", kMaxJsonDepth));
}

Json parse_object(const std::string& text) {
  check_depth(text);
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) malformed("not valid JSON");
  if (j.is_array()) return Json{{"messages", j}};  // a bare list of messages
  if (!j.is_object()) malformed(fmt::format("{} in JSON, not an object holding a conversation", kind(j)));
  return j;
}

const Json* find(const Json& j, const std::string& key) {
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

std::string keys_of(const Json& j) {
  std::string out;
  for (auto it = j.begin(); it != j.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out.empty() ? "nothing" : out;
}

ChatFormat detect(const Json& j, const ChatFields& f) {
  if (find(j, f.messages)) return ChatFormat::kOpenAI;
  if (find(j, f.conversations)) return ChatFormat::kShareGPT;
  if (find(j, f.instruction) && find(j, f.output)) return ChatFormat::kAlpaca;
  malformed(fmt::format("no conversation: the object has {}, not '{}', '{}' or '{}' with '{}'", keys_of(j), f.messages, f.conversations,
                        f.instruction, f.output));
}

std::string text_field(const Json& j, const std::string& key, const char* what) {
  const Json* v = find(j, key);
  if (!v) malformed(fmt::format("{} has no '{}'", what, key));
  if (!v->is_string()) malformed(fmt::format("{} '{}' is {}, not a string", what, key, kind(*v)));
  return v->get<std::string>();
}

std::string role_of(const std::string& given, bool sharegpt) {
  if (given == "system" || given == "user" || given == "assistant" || given == "tool") return given;
  if (sharegpt) {
    if (given == "human") return "user";
    if (given == "gpt" || given == "chatgpt" || given == "bard" || given == "function_call") return "assistant";
    if (given == "observation" || given == "function_response") return "tool";
  }
  malformed(fmt::format("unknown role '{}' (dstrain knows system, user, assistant and tool{})", given,
                        sharegpt ? "; ShareGPT's human, gpt, observation and function_call" : ""));
}

struct Builder {
  Json messages = Json::array();
  Conversation out;

  void add(const std::string& role, const Json& content, Json extra, int8_t train) {
    Json m = Json::object();
    m["role"] = role;
    m["content"] = content;
    for (auto it = extra.begin(); it != extra.end(); ++it) m[it.key()] = it.value();
    messages.push_back(std::move(m));
    out.roles.push_back(role);
    out.contents.push_back(content.is_string() ? content.get<std::string>() : "");
    out.train.push_back(train);
  }
};

void read_message_list(const Json& list, bool sharegpt, const ChatFields& f, Builder& b) {
  const std::string& role_key = sharegpt ? f.from : f.role;
  const std::string& content_key = sharegpt ? f.value : f.content;
  size_t index = 0;
  for (const Json& m : list) {
    const std::string which = fmt::format("message {}", index++);
    if (!m.is_object()) malformed(fmt::format("{} is {}, not an object", which, kind(m)));
    const Json* role = find(m, role_key);
    if (!role) malformed(fmt::format("{} has no '{}' (it has {})", which, role_key, keys_of(m)));
    if (!role->is_string()) malformed(fmt::format("{}'s '{}' is {}, not a string", which, role_key, kind(*role)));
    const std::string r = role_of(role->get<std::string>(), sharegpt);
    const Json* content = find(m, content_key);
    const bool tool_call = r == "assistant" && find(m, "tool_calls");
    if (!content && !tool_call) malformed(fmt::format("{} ({}) has no '{}'", which, r, content_key));
    const Json c = content ? *content : Json();
    if (!c.is_string() && !(c.is_null() && tool_call))
      malformed(fmt::format("{} ({}): '{}' is {}, not a string", which, r, content_key, kind(c)));
    int8_t train = -1;
    Json extra = Json::object();
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.key() == role_key || it.key() == content_key) continue;
      if (it.key() == f.train && it->is_null()) continue;  // a Parquet column without a value in this row
      if (it.key() == f.train) {
        if (!it->is_boolean()) malformed(fmt::format("{}: '{}' is {}, not true or false", which, f.train, kind(*it)));
        train = it->get<bool>() ? 1 : 0;
        continue;
      }
      extra[it.key()] = it.value();
    }
    b.add(r, c, std::move(extra), train);
  }
}

void read_alpaca(const Json& j, const ChatFields& f, Builder& b) {
  if (const Json* s = find(j, f.system); s && !s->is_null()) {
    if (!s->is_string()) malformed(fmt::format("'{}' is {}, not a string", f.system, kind(*s)));
    if (!s->get<std::string>().empty()) b.add("system", *s, Json::object(), -1);
  }
  if (const Json* h = find(j, f.history); h && !h->is_null()) {
    if (!h->is_array()) malformed(fmt::format("'{}' is {}, not a list of [user, assistant] pairs", f.history, kind(*h)));
    for (size_t i = 0; i < h->size(); ++i) {
      const Json& pair = (*h)[i];
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
        malformed(fmt::format("'{}' entry {} is not a [user, assistant] pair of strings", f.history, i));
      b.add("user", pair[0], Json::object(), -1);
      b.add("assistant", pair[1], Json::object(), -1);
    }
  }
  std::string prompt = text_field(j, f.instruction, "the example");
  if (const Json* in = find(j, f.input); in && !in->is_null()) {
    if (!in->is_string()) malformed(fmt::format("'{}' is {}, not a string", f.input, kind(*in)));
    if (!in->get<std::string>().empty()) prompt += "\n" + in->get<std::string>();  // as LLaMA-Factory joins them
  }
  b.add("user", prompt, Json::object(), -1);
  b.add("assistant", text_field(j, f.output, "the example"), Json::object(), -1);
}

}  // namespace

void set_chat_field(ChatFields& f, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string name = assignment.substr(0, eq), key = eq == std::string::npos ? "" : assignment.substr(eq + 1);
  std::string* field = name == "messages"        ? &f.messages
                       : name == "role"          ? &f.role
                       : name == "content"       ? &f.content
                       : name == "conversations" ? &f.conversations
                       : name == "from"          ? &f.from
                       : name == "value"         ? &f.value
                       : name == "instruction"   ? &f.instruction
                       : name == "input"         ? &f.input
                       : name == "output"        ? &f.output
                       : name == "system"        ? &f.system
                       : name == "history"       ? &f.history
                       : name == "train"         ? &f.train
                                                 : nullptr;
  if (!field || key.empty())
    throw Error(ErrorCode::kUsage, fmt::format("--chat-fields '{}' is not NAME=KEY with a known NAME", assignment),
                "NAME is one of messages, role, content, conversations, from, value, instruction, input, output, system, history, "
                "train; e.g. --chat-fields messages=dialog,role=speaker");
  *field = key;
}

Conversation parse_conversation(const std::string& text, ChatFormat format, const ChatFields& f) {
  const Json j = parse_object(text);
  if (format == ChatFormat::kAuto) format = detect(j, f);
  Builder b;
  Json variables = Json::object();
  if (format == ChatFormat::kAlpaca) {
    read_alpaca(j, f, b);
  } else {
    const bool sharegpt = format == ChatFormat::kShareGPT;
    const std::string& key = sharegpt ? f.conversations : f.messages;
    const Json* list = find(j, key);
    if (!list) malformed(fmt::format("no '{}' (the object has {})", key, keys_of(j)));
    if (!list->is_array()) malformed(fmt::format("'{}' is {}, not a list of messages", key, kind(*list)));
    if (const Json* s = find(j, f.system); sharegpt && s && s->is_string() && !s->get<std::string>().empty())
      b.add("system", *s, Json::object(), -1);  // ShareGPT sets keep the system prompt beside the turns
    read_message_list(*list, sharegpt, f, b);
  }
  if (b.messages.empty()) malformed("the conversation has no messages");
  for (const char* key : {"tools", "documents"})
    if (const Json* v = find(j, key)) variables[key] = *v;
  variables["messages"] = std::move(b.messages);
  b.out.json = variables.dump();
  return std::move(b.out);
}

bool looks_like_conversation(const std::string& text, const ChatFields& f) {
  if (json_nesting_depth(text) > kMaxJsonDepth) return false;
  const Json j = Json::parse(text, nullptr, false);
  if (j.is_array()) return !j.empty() && j.front().is_object() && j.front().contains(f.role);
  if (!j.is_object()) return false;
  const Json* m = find(j, f.messages);
  const Json* c = find(j, f.conversations);
  return (m && m->is_array()) || (c && c->is_array()) || (find(j, f.instruction) && find(j, f.output));
}

std::vector<std::string> json_array_elements(const std::string& text) {
  check_depth(text);
  const Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) malformed("not valid JSON");
  if (!j.is_array()) malformed(fmt::format("{} in JSON, not an array of examples", kind(j)));
  std::vector<std::string> out;
  out.reserve(j.size());
  for (const Json& e : j) out.push_back(e.dump());
  return out;
}

}  // namespace dstrain::data
