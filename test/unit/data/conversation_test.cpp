// data/conversation.h: the input layouts become the same OpenAI-style messages, fields can be
// renamed, and a malformed example is refused saying what is wrong.
#include "catch_torch.h"

#include "dstrain/core/error.h"
#include "dstrain/data/conversation.h"

using dstrain::data::ChatFields;
using dstrain::data::ChatFormat;
using dstrain::data::Conversation;
using dstrain::data::ConversationError;
using dstrain::data::parse_conversation;

namespace {

std::string error_of(const std::string& json, ChatFormat format = ChatFormat::kAuto) {
  try {
    parse_conversation(json, format, ChatFields());
  } catch (const ConversationError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every layout gives OpenAI-style messages", "[data][chat]") {
  const ChatFields f;
  const Conversation openai = parse_conversation(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "id": 7})",
      ChatFormat::kAuto, f);
  CHECK(openai.json ==
        R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]})");
  CHECK(openai.roles == std::vector<std::string>{"system", "user", "assistant"});
  const Conversation sharegpt = parse_conversation(
      R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})",
      ChatFormat::kAuto, f);
  CHECK(sharegpt.json == openai.json);
  const Conversation alpaca = parse_conversation(R"({"system": "S", "instruction": "Q", "output": "A"})", ChatFormat::kAuto, f);
  CHECK(alpaca.json == openai.json);
  const Conversation history =
      parse_conversation(R"({"instruction": "Q2", "input": "more", "output": "A2", "history": [["Q", "A"]]})", ChatFormat::kAuto, f);
  CHECK(history.contents == std::vector<std::string>{"Q", "A", "Q2\nmore", "A2"});
  const Conversation bare = parse_conversation(R"([{"role": "user", "content": "Q"}])", ChatFormat::kAuto, f);
  CHECK(bare.roles == std::vector<std::string>{"user"});
}

TEST_CASE("per-message train flags, tools and renamed fields", "[data][chat]") {
  const Conversation c = parse_conversation(
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": null, "tool_calls": [1], "train": false}], "tools": []})",
      ChatFormat::kOpenAI, ChatFields());
  CHECK(c.train == std::vector<int8_t>{-1, 0});
  CHECK(c.json == R"({"tools":[],"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":null,"tool_calls":[1]}]})");
  ChatFields f;
  dstrain::data::set_chat_field(f, "messages=dialog");
  dstrain::data::set_chat_field(f, "role=speaker");
  const Conversation renamed = parse_conversation(R"({"dialog": [{"speaker": "user", "content": "Q"}]})", ChatFormat::kAuto, f);
  CHECK(renamed.roles == std::vector<std::string>{"user"});
  CHECK_THROWS_AS(dstrain::data::set_chat_field(f, "speaker=x"), dstrain::Error);
  CHECK(dstrain::data::looks_like_conversation(R"({"instruction": "a", "output": "b"})", ChatFields()));
  CHECK_FALSE(dstrain::data::looks_like_conversation(R"({"text": "plain"})", ChatFields()));
}

TEST_CASE("malformed examples say what is wrong", "[data][chat]") {
  CHECK(error_of("{") == "not valid JSON");
  CHECK(error_of("3") == "a number in JSON, not an object holding a conversation");
  CHECK(error_of(R"({"text": "x"})").find("no conversation: the object has text") == 0);
  CHECK(error_of(R"({"messages": []})") == "the conversation has no messages");
  CHECK(error_of(R"({"messages": {"role": "user"}})") == "'messages' is an object, not a list of messages");
  CHECK(error_of(R"({"messages": ["hi"]})") == "message 0 is a string, not an object");
  CHECK(error_of(R"({"messages": [{"content": "x"}]})") == "message 0 has no 'role' (it has content)");
  CHECK(error_of(R"({"messages": [{"role": "bot", "content": "x"}]})").find("unknown role 'bot'") == 0);
  CHECK(error_of(R"({"messages": [{"role": "user", "content": 5}]})") == "message 0 (user): 'content' is a number, not a string");
  CHECK(error_of(R"({"messages": [{"role": "user", "content": null}]})") == "message 0 (user): 'content' is null, not a string");
  CHECK(error_of(R"({"messages": [{"role": "user", "content": "x", "train": 1}]})") == "message 0: 'train' is a number, not true or false");
  CHECK(error_of(R"({"conversations": [{"from": "human"}]})") == "message 0 (user) has no 'value'");
  CHECK(error_of(R"({"instruction": "q", "output": "a", "history": [["q"]]})") ==
        "'history' entry 0 is not a [user, assistant] pair of strings");
  CHECK(error_of(R"({"instruction": 1, "output": "a"})", ChatFormat::kAlpaca) == "the example 'instruction' is a number, not a string");
}
