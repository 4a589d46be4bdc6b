#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

#include "commands.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"

namespace dstrain::app {

// dstrain chat-template: what a model's chat template makes of conversations, exactly as
// transformers' apply_chat_template(tokenize=False) renders them.
void register_chat_template(CLI::App& app, Run& run) {
  struct Args {
    std::string source, messages = "-", name = "default";
    std::string bos, eos;
    bool generation_prompt = false, json = false, keep_going = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("chat-template", "Render conversations with a model's chat template (as transformers does)");
  cmd->footer(
      "SOURCE is a tokenizer directory (tokenizer_config.json's chat_template, bos_token and\n"
      "eos_token), a tokenizer_config.json, or a template file. Each line of --messages is one\n"
      "conversation: a JSON array of {\"role\", \"content\"} messages, or an object with \"messages\"\n"
      "and any other variables the template reads (\"tools\", \"add_generation_prompt\", ...).\n"
      "The template runs as Hugging Face runs it (Jinja2's sandbox with trim_blocks and\n"
      "lstrip_blocks); a construct dstrain cannot render exactly is refused with its line and column.\n\n"
      "Exit codes: 0 rendered; 2 a bad template or flags; 3 a conversation the template refused.\n\n"
      "Examples:\n"
      "  dstrain chat-template models/deepseek-coder-instruct --messages chats.jsonl\n"
      "  echo '[{\"role\":\"user\",\"content\":\"Hi\"}]' | dstrain chat-template tok/ --add-generation-prompt\n"
      "  dstrain chat-template my.jinja --messages chats.jsonl --json   (one {\"text\", \"generation_spans\"} per line)");
  cmd->add_option("source", args->source, "Tokenizer directory, tokenizer_config.json or template file")->required();
  cmd->add_option("--messages", args->messages, "JSON Lines file of conversations ('-': standard input)");
  cmd->add_option("--template-name", args->name, "Which of a tokenizer's named templates (default: default)");
  cmd->add_flag("--add-generation-prompt", args->generation_prompt,
                "End with the assistant's prompt (unless a line sets add_generation_prompt)");
  cmd->add_flag("--json", args->json, "One JSON object per conversation: {\"text\", \"generation_spans\"}");
  cmd->add_flag("--keep-going", args->keep_going,
                "With --json: print {\"error\"} for a conversation the template refuses and go on (exit 3 at the end)");
  cmd->add_option("--bos-token", args->bos, "bos_token for the template (default: the tokenizer's)");
  cmd->add_option("--eos-token", args->eos, "eos_token for the template (default: the tokenizer's)");
  cmd->callback([args, &run] {
    run = [args] {
      text::ChatTemplateSource src = text::read_chat_template(args->source, args->name);
      if (!args->bos.empty()) src.bos_token = args->bos;
      if (!args->eos.empty()) src.eos_token = args->eos;
      if (args->keep_going && !args->json) throw Error(ErrorCode::kUsage, "--keep-going needs --json", "");
      int refused = 0;
      const text::ChatTemplate tmpl(src.source, src.name);
      std::ifstream file;
      if (args->messages != "-") {
        file.open(args->messages);
        if (!file) throw Error(ErrorCode::kUsage, fmt::format("cannot read --messages '{}'", args->messages), "");
      }
      std::istream& in = args->messages == "-" ? std::cin : file;
      const std::string where = args->messages == "-" ? "<stdin>" : args->messages;
      std::string line;
      for (int64_t n = 1, shown = 0; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        text::jinja::Value context;
        try {
          context = text::chat_context(line, src, args->generation_prompt);
        } catch (const std::invalid_argument& e) {
          if (args->keep_going) {
            fmt::print("{}\n", nlohmann::ordered_json{{"error", e.what()}}.dump()), ++refused;
            continue;
          }
          throw Error(ErrorCode::kData, fmt::format("{}:{}: {}", where, n, e.what()), "");
        }
        text::ChatRender r;
        try {
          r = tmpl.render(context);
        } catch (const Error& e) {
          if (args->keep_going && e.code() == ErrorCode::kData) {
            fmt::print("{}\n", nlohmann::ordered_json{{"error", e.what()}}.dump()), ++refused;
            continue;
          }
          throw Error(e.code(), fmt::format("{}:{}: {}", where, n, e.what()), e.hint());
        }
        if (args->json) {
          fmt::print("{}\n", nlohmann::ordered_json{{"text", r.text}, {"generation_spans", r.generation_spans}}.dump());
        } else {
          if (shown++ > 0) fmt::print("\n");
          fmt::print("==> {}:{} <==\n{}\n", where, n, r.text);
        }
      }
      return refused > 0 ? exit_status::kData : exit_status::kOk;
    };
  });
}

}  // namespace dstrain::app
