#include <CLI/CLI.hpp>

#include "commands.h"
#include "dstrain/tasks/generate_task.h"

namespace dstrain::app {

void register_chat(CLI::App& app, Run& run) {
  struct Args {
    tasks::GenerateRequest request;
    std::string save;
  };
  auto args = std::make_shared<Args>();
  args->request.options.max_new_tokens = 512;
  CLI::App* cmd = app.add_subcommand("chat", "Talk with a checkpoint or a Hugging Face model on a terminal, through its chat template");
  cmd->footer(
      "TARGET is a run directory (its latest checkpoint that verifies, or --step N / --step best),\n"
      "one checkpoint of a run, or a Hugging Face model folder; a LoRA run talks with its adapters.\n"
      "Each line you type is a user message; the conversation so far goes through the model's chat\n"
      "template with its generation prompt, and the answer is streamed as it comes and kept in the\n"
      "history. /reset starts a new conversation, /system TEXT sets the system message (and starts\n"
      "a new one; /system alone removes it), Ctrl-D leaves. Greedy unless --temperature is set; an\n"
      "answer ends at the tokenizer's end of sequence or end of turn, a --stop string or id, or after\n"
      "--max-new-tokens (default 512). --save FILE keeps the session's conversations as JSON Lines\n"
      "{\"messages\": [...]}, which `dstrain generate --prompts` and prepare-data --chat read.\n"
      "It needs a terminal: for conversations from a file or a pipe use dstrain generate --prompts.\n\n"
      "Exit codes: 0 done; 2 bad flags or target, no terminal, or a tokenizer without a chat template;\n"
      "4 a missing or damaged checkpoint; 5 no such device.\n\n"
      "Examples:\n"
      "  dstrain chat runs/sft\n"
      "  dstrain chat runs/sft --step best --temperature 0.7 --top-p 0.9 --save chats.jsonl");
  add_generation_flags(*cmd, args->request);
  cmd->add_option("--save", args->save, "Write the session's conversations to this file (JSON Lines {\"messages\": [...]})");
  cmd->callback([args, &run] { run = [args] { return tasks::run_chat(args->request, args->save); }; });
}

}  // namespace dstrain::app
