#pragma once
// One fine-tuning example read from a JSON object, in the layouts datasets ship: OpenAI-style
// `messages` ({role, content}; system, user, assistant, tool), ShareGPT `conversations`
// ({from, value}; human/gpt/system/tool/observation/function_call), Alpaca (`instruction`,
// optional `input`, `output`, optional `system` and `history` [[user, assistant], ...]) and
// DeepSeek-Coder's `instruction`/`output` (Alpaca without `input`). Field names can be remapped.
// The result is what a chat template receives: {"messages": [{role, content, ...}], ...}.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dstrain::data {

enum class ChatFormat { kAuto, kOpenAI, kShareGPT, kAlpaca };

// The JSON keys of each layout (`--chat-fields messages=dialog,role=speaker,...` renames them).
struct ChatFields {
  std::string messages = "messages", role = "role", content = "content";
  std::string conversations = "conversations", from = "from", value = "value";
  std::string instruction = "instruction", input = "input", output = "output", system = "system", history = "history";
  std::string train = "train";  // a message's own switch: "train": false keeps it out of the loss
};

// Sets one field from "NAME=KEY"; throws Error{kUsage} for an unknown NAME.
void set_chat_field(ChatFields& fields, const std::string& assignment);

struct Conversation {
  // The template's variables as JSON: "messages" (OpenAI-style dicts, any other keys the input's
  // messages had kept) and the input's other top-level keys (tools, documents, ...).
  std::string json;
  std::vector<std::string> roles;     // per message: system, user, assistant or tool
  std::vector<std::string> contents;  // per message: its text ("" when null)
  std::vector<int8_t> train;          // per message: -1 unset, 0 "train": false, 1 "train": true
};

// A malformed example: what is wrong, without the file and line (the caller adds them).
struct ConversationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses the JSON text of one example. Throws ConversationError: not JSON, not an object, no
// layout recognized, no or empty messages, a message that is not an object, a missing or unknown
// role, content that is not a string (null only on an assistant message with tool_calls).
Conversation parse_conversation(const std::string& json, ChatFormat format, const ChatFields& fields);

// Whether the JSON text of a line holds an example in one of the layouts (prepare-data chooses
// --chat by itself when the first line does).
bool looks_like_conversation(const std::string& json, const ChatFields& fields);

// The JSON texts of a JSON array's elements (a .json file of examples); throws ConversationError.
std::vector<std::string> json_array_elements(const std::string& json);

}  // namespace dstrain::data
