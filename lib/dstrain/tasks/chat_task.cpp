#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/tasks/generate_task.h"

namespace dstrain::tasks {
namespace {

const char* kChatHelp = "/reset forgets the conversation, /system TEXT sets the system message (and starts again), Ctrl-D leaves";

// The conversations of a session (each /reset or /system starts one), as JSON Lines
// {"messages": [...]}: rewritten after every answer, atomically.
// A conversation worth keeping: one with something the user said.
bool has_turns(const nlohmann::json& messages) {
  for (const auto& m : messages)
    if (m.at("role") == "user") return true;
  return false;
}

struct Transcript {
  std::string path;
  nlohmann::json done = nlohmann::json::array();
  void save(const nlohmann::json& current) const {
    if (path.empty()) return;
    std::string text;
    for (const auto& c : done) text += nlohmann::json{{"messages", c}}.dump() + "\n";
    if (has_turns(current)) text += nlohmann::json{{"messages", current}}.dump() + "\n";
    write_file_atomic(path, text);
  }
};

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

int run_chat(const GenerateRequest& r, const std::string& save_path) {
  if (::isatty(STDIN_FILENO) == 0)
    throw Error(ErrorCode::kUsage, "dstrain chat talks with a person at a terminal, and its input is not one",
                "for conversations from a file or a pipe, use `dstrain generate TARGET --prompts FILE` with {\"messages\": [...]} lines");
  GenerationSession session(r, "dstrain chat");
  session.encode_messages(R"([{"role": "user", "content": "hello"}])");  // no template: refused now, not after the first line
  std::fputs(fmt::format("chatting with {}. {}.\n", session.describe(), kChatHelp).c_str(), stderr);
  Transcript transcript{save_path};
  nlohmann::json messages = nlohmann::json::array();
  std::string system;
  auto start_again = [&] {
    if (has_turns(messages)) transcript.done.push_back(messages);
    messages = nlohmann::json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  };
  std::string line;
  while (true) {
    std::fputs("> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    const std::string said = trimmed(line);
    if (said.empty()) continue;
    if (said == "/reset" || said == "/system" || said.rfind("/system ", 0) == 0) {
      if (said != "/reset") system = trimmed(said.substr(7));
      start_again();
      std::fputs(said == "/reset" ? "(a new conversation)\n"
                 : system.empty() ? "(no system message; a new conversation)\n"
                                  : "(system message set; a new conversation)\n",
                 stdout);
      continue;
    }
    if (said[0] == '/' && said.find(' ') == std::string::npos) {
      std::fputs(fmt::format("(unknown command {}: {})\n", said, kChatHelp).c_str(), stdout);
      continue;
    }
    nlohmann::json next = messages;
    next.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int64_t> ids = session.encode_messages(next.dump());
    const auto n = static_cast<int64_t>(ids.size());
    if (n + session.max_new_tokens() > session.context()) {
      std::fputs(fmt::format("(the conversation is {} tokens, and with {} new ones more than the model's {} positions: /reset to start "
                             "again, or a lower --max-new-tokens)\n",
                             n, session.max_new_tokens(), session.context())
                     .c_str(),
                 stdout);
      continue;
    }
    const GenerationSession::Batch out = session.run({ids}, /*stream=*/true);
    std::fputs("\n", stdout), std::fflush(stdout);
    next.push_back({{"role", "assistant"}, {"content", session.text_of(out.rows.front())}});
    messages = next;
    transcript.save(messages);
  }
  std::fputs("\n", stdout);
  start_again();
  transcript.save(messages);
  return exit_status::kOk;
}

}  // namespace dstrain::tasks
