#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include "commands.h"
#include "dstrain/core/error.h"
#include "dstrain/tasks/generate_task.h"

namespace dstrain::app {

void add_generation_flags(CLI::App& app, tasks::GenerateRequest& r) {
  CLI::App* cmd = &app;
  cmd->add_option("target", r.target, "Run directory, checkpoint, or Hugging Face model folder")->required();
  cmd->add_option("--step", r.step, "A run's checkpoint: a step number, or best; default: the latest");
  cmd->add_option("--max-new-tokens", r.options.max_new_tokens, "New tokens per prompt at most (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--temperature", r.options.sampling.temperature, "0: greedy (default); otherwise sample at this temperature")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", r.options.sampling.top_k, "Sample from the k most likely tokens (0: all; default)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--top-p", r.options.sampling.top_p, "Sample from the smallest set of tokens with this probability (1: all; default)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repetition-penalty", r.options.sampling.repetition_penalty,
                  "Divide (multiply, when negative) the logits of tokens already in the row by this (1: off; default)")
      ->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--seed", r.options.seed, "The sampling generator's seed (default 0): the same tokens for the same seed");
  cmd->add_option("--stop", r.stop, "A stop string (repeatable): the row stops once its text holds it, and the text ends before it");
  cmd->add_option("--stop-id", r.stop_ids, "A token id that ends a row (repeatable), besides the tokenizer's end of sequence");
  cmd->add_option("--tokenizer", r.tokenizer,
                  "The model's tokenizer folder (default: the target's, model.init_from's, or the run's data's)");
  cmd->add_option("--device", r.device, "auto (a GPU when there is one; default), cpu, cuda or cuda:N");
  cmd->add_option("--dtype", r.dtype, "fp32, bf16 or fp16 (default: the run's precision.dtype; a folder: fp32 on CPU, bf16 on a GPU)");
}

void register_generate(CLI::App& app, Run& run) {
  struct Args {
    tasks::GenerateRequest request;
    bool no_cache = false, no_stream = false;
  };
  auto args = std::make_shared<Args>();
  tasks::GenerateRequest& r = args->request;
  CLI::App* cmd =
      app.add_subcommand("generate", "Text from a checkpoint or a Hugging Face model: greedy or sampled, with a key/value cache");
  cmd->footer(
      "TARGET is a run directory (its latest checkpoint that verifies, or --step N / --step best),\n"
      "one checkpoint of a run, or a Hugging Face model folder; a LoRA run generates with its adapters.\n"
      "A --prompt is tokenized as transformers' tokenizer(TEXT) does (the tokenizer's BOS included).\n"
      "--prompts FILE holds one JSON object per line: {\"prompt\": TEXT}, or {\"messages\": [...]}, which\n"
      "is rendered with the model's chat template and its generation prompt (apply_chat_template).\n"
      "Prompts run in batches of --batch-size, left-padded as transformers pads them, each token\n"
      "after the first forward computed against the key/value cache (MLA keeps its compressed latent).\n"
      "Sampling applies, in transformers' order: --repetition-penalty, --temperature, --top-k, --top-p;\n"
      "--temperature 0 (the default) is greedy. A row stops at the tokenizer's end of sequence (and\n"
      "a folder's generation_config.json eos_token_id), at a --stop-id, at a --stop string (the text\n"
      "ends before it), or after --max-new-tokens.\n"
      "Prints each prompt's text (streamed as it comes on a terminal), or with --json one object per\n"
      "prompt: {\"index\", \"prompt_tokens\", \"text\", \"token_ids\", \"finish_reason\": \"stop\"|\"length\",\n"
      "\"tokens_per_s\"}; token_ids are the new tokens, a final end-of-sequence id included.\n\n"
      "Exit codes: 0 done; 2 bad flags, target or --prompt; 3 a bad --prompts line;\n"
      "4 a missing or damaged checkpoint; 5 no such device.\n\n"
      "Examples:\n"
      "  dstrain generate runs/sft --prompt 'def fibonacci(n):' --max-new-tokens 64\n"
      "  dstrain generate runs/sft --step best --prompts questions.jsonl --json > answers.jsonl\n"
      "  dstrain generate hf-export --prompt 'Once upon a time' --temperature 0.8 --top-p 0.95 --seed 1");
  add_generation_flags(*cmd, r);
  cmd->add_option("--prompt", r.prompts, "A prompt (repeatable)");
  cmd->add_option("--prompts", r.prompts_file, "JSON Lines of {\"prompt\": TEXT} or {\"messages\": [...]}")->check(CLI::ExistingFile);
  cmd->add_option("--batch-size", r.batch_size, "Prompts per batch (default 8)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_flag("--json", r.json, "One JSON object per prompt");
  cmd->add_flag("--no-cache", args->no_cache, "Run the whole sequence at every token (no key/value cache): slower, for checking");
  cmd->add_flag("--no-stream", args->no_stream, "Print each text when it is done, also on a terminal");
  cmd->callback([args, &run] {
    run = [args] {
      tasks::GenerateRequest request = args->request;
      request.options.use_cache = !args->no_cache;
      const bool one = request.prompts.size() + (request.prompts_file.empty() ? 0 : 2) == 1;
      request.stream = one && !request.json && !args->no_stream && ::isatty(STDOUT_FILENO) != 0;
      return tasks::run_generate(request);
    };
  });
}

}  // namespace dstrain::app
