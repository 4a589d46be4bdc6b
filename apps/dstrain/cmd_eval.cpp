#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/log.h"
#include "dstrain/launch/plan.h"
#include "dstrain/core/error.h"
#include "dstrain/tasks/task_scoring.h"
#include "dstrain/tasks/eval_target.h"
#include "dstrain/tasks/eval_task.h"
#include "launch_flags.h"

namespace dstrain::app {

void register_eval(CLI::App& app, Run& run) {
  struct Args {
    std::string target, step, tokenizer, samples, task_format = "dstrain";
    int64_t task_batch_size = 1;
    std::vector<std::string> tasks;
    tasks::EvalFlags flags;
    int64_t max_batches = -1, micro_batch_size = 0, seq_len = 0;
    bool json = false;
    int timeout_s = 300;
    launch::LaunchFlags launch;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "The validation loss of a checkpoint or a Hugging Face model on held-out data");
  cmd->footer(
      "TARGET is a run directory (its latest checkpoint that verifies, or --step N / --step best),\n"
      "one checkpoint of a run (RUN_DIR/ckpt/step_XXXXXXXX), or a Hugging Face model folder.\n"
      "Without --data a run is evaluated on its own sets (eval.paths and the eval.split documents\n"
      "held out from its data) with its eval settings, which gives the value training logged for\n"
      "that checkpoint, at any number of ranks. Each rank holds the weights in the run's dtype\n"
      "(no optimizer state, whatever ZeRO stage wrote them); the windows of each set are shared\n"
      "out over the ranks and the loss is Σ token losses / Σ tokens over all of them.\n"
      "A fine-tuning set (prepare-data --chat, or the conversations eval.split holds out of one)\n"
      "is scored on the tokens its loss mask trains, its conversations packed in file order into\n"
      "rows (the windows column counts those rows).\n"
      "A preference set (prepare-data --preference) is scored per pair as the run's objective scores it:\n"
      "dpo's, cpo's, simpo's or orpo's loss, rewards/accuracies and rewards/margins (--json: every\n"
      "metric, nll_loss and orpo's log-odds too); a reward model's loss, accuracy and margin.\n"
      "A KTO set (prepare-data --preference --kto) is scored per example as a kto run scores it:\n"
      "the loss, kl and rewards/margins (--json: every metric).\n"
      "A reward model's Hugging Face folder (*ForSequenceClassification) scores pairs as one.\n"
      "Prints one row per set: val_loss, val_ppl = exp(min(loss, 20)), tokens, windows, time.\n"
      "With --task (instead of the sets): multiple-choice tasks as lm-evaluation-harness scores them:\n"
      "each choice's log-likelihood after the context (tokenized as its HFLM does), acc = the most\n"
      "likely choice is gold, acc_norm = the same per character of the choice; the requests shared\n"
      "out over the ranks (--json: {\"tasks\": [{\"name\", \"acc\", \"acc_norm\", \"n\", ...}]}).\n"
      "--task-format hellaswag|arc|mmlu reads those datasets' rows as downloaded (JSON Lines).\n\n"
      "Exit codes: 0 done; 2 bad flags or target; 3 bad data; 4 a missing or damaged checkpoint.\n\n"
      "Examples:\n"
      "  dstrain eval runs/demo                        (the run's latest checkpoint on its held-out split)\n"
      "  dstrain eval runs/demo --step best --nproc-per-node 4 --json\n"
      "  dstrain eval runs/demo --data data/val --data data/code-val --name val --name code\n"
      "  dstrain eval runs/sft --data data/chat-val   (the loss on the answers of held-out conversations)\n"
      "  dstrain eval hf-export --data val.txt --format bytes --seq-len 512\n"
      "  dstrain eval exported/reward --data data/pairs-val --seq-len 1024   (a reward model: pairwise accuracy)\n"
      "  dstrain eval runs/sft --task tasks/arc_easy.jsonl --task tasks/hellaswag.jsonl --json");
  cmd->add_option("target", args->target, "Run directory, checkpoint, or Hugging Face model folder")->required();
  cmd->add_option("--step", args->step, "A run's checkpoint: a step number, or best (checkpoint.keep_best's); default: the latest");
  cmd->add_option("--data", args->flags.data, "An evaluation set (repeatable): prepare-data's PREFIX, or a file in --format");
  cmd->add_option("--name", args->flags.names, "The name of each --data set, in order (default: its file stem)");
  cmd->add_option("--task", args->tasks,
                  "A task (repeatable), named by its file stem: JSON Lines of multiple-choice rows {\"context\", \"choices\": [...], "
                  "\"gold\": INDEX}, scored as lm-evaluation-harness scores multiple_choice tasks (acc, acc_norm), or of generative "
                  "rows {\"context\", \"target\"} (after an optional {\"settings\": {...}} line: until, max_gen_toks, regex_pattern, "
                  "...), generated greedily and scored as its generate_until tasks (exact_match)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--task-format", args->task_format,
                  "The --task files' rows: dstrain ({context, choices, gold} or {context, target}, the default), or as downloaded: "
                  "hellaswag, arc (ARC-Easy/Challenge), mmlu, or gsm8k (generative: exact_match, strict and flexible), turned into "
                  "prompts as lm-evaluation-harness's task definitions do (zero-shot)")
      ->check(CLI::IsMember({"dstrain", "hellaswag", "arc", "mmlu", "gsm8k"}));
  cmd->add_option("--task-batch-size", args->task_batch_size,
                  "With --task: generative questions generated together on a rank, as lm-evaluation-harness's --batch_size (sorted "
                  "longest first, left-padded); default 1: each alone, as lm-eval's default")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--log-samples", args->samples,
                  "With --task: write each question's log-likelihoods, choice and gold, or generation, answers and target, to this file "
                  "(JSON Lines, as lm-eval's --log_samples)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "With --task: the model's tokenizer folder (default: the Hugging Face target's, model.init_from's, or the run's data's)");
  cmd->add_option("--max-batches", args->max_batches,
                  "Micro-batches per set over all ranks (0: the whole set; default: the run's eval.max_batches)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--micro-batch-size", args->micro_batch_size,
                  "Windows per micro-batch (default: the run's eval.micro_batch_size; 4 for a Hugging Face folder)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--format", args->flags.format,
                  "Format of the --data files: bytes, megatron, llmc, raw_u16 (default: the run's data.format)");
  cmd->add_option("--seq-len", args->seq_len, "Tokens per window (default: the run's data.seq_len; required for a Hugging Face folder)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--dtype", args->flags.dtype, "fp32, bf16 or fp16 (default: the run's precision.dtype; fp32 for a Hugging Face folder)");
  cmd->add_option("--expert-parallel-size", args->flags.expert_parallel_size,
                  "MoE: ranks that share out each layer's routed experts (default 1: every rank holds them all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_flag("--json", args->json, "Print one JSON object: {\"step\", \"world_size\", \"datasets\": [{\"name\", \"val_loss\", ...}]}");
  cmd->add_option("--timeout", args->timeout_s, "Rendezvous and collective timeout, seconds (default 300)")->check(CLI::Range(1, 86400));
  add_launch_flags(*cmd, args->launch);
  cmd->callback([args, &run] {
    run = [args] {
      const launch::Topology topo = launch::decide_topology(args->launch, 1, false, 1, "127.0.0.1", 0);
      tasks::EvalFlags flags = args->flags;
      if (args->max_batches >= 0) flags.max_batches = args->max_batches;
      if (args->micro_batch_size > 0) flags.micro_batch_size = args->micro_batch_size;
      if (args->seq_len > 0) flags.seq_len = args->seq_len;
      flags.world_size = topo.mode == launch::Topology::Mode::kRank ? topo.world_size : topo.world();
      flags.tasks = args->tasks;
      if (args->tasks.empty())
        for (const auto& [set, flag] : {std::pair{!args->tokenizer.empty(), "--tokenizer"},
                                        {!args->samples.empty(), "--log-samples"},
                                        {args->task_format != "dstrain", "--task-format"},
                                        {args->task_batch_size != 1, "--task-batch-size"}})
          if (set) throw Error(ErrorCode::kUsage, fmt::format("{} goes with --task", flag), "pass --task FILE, or leave it out");
      const tasks::EvalTarget target = tasks::resolve_eval_target(args->target, args->step);
      const config::Recipe recipe = tasks::eval_recipe(target, flags);
      for (const auto& warning : recipe.warnings) log::warn(warning);
      const std::string task_set = args->tasks.empty() ? ""
                                                       : tasks::encode_tasks(args->tasks, args->tokenizer, target, recipe,
                                                                             data::task_format(args->task_format), args->task_batch_size);
      return tasks::evaluate_target(topo, target, recipe, args->json, args->timeout_s, self_executable(), task_set, args->samples);
    };
  });
}

}  // namespace dstrain::app
