#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/core/error.h"
#include "dstrain/data/prepare.h"
#include "dstrain/train/step_triggers.h"

namespace dstrain::app {
namespace {

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  for (size_t start = 0; !list.empty() && start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

struct ChatFlags {
  bool chat = false, no_chat = false, preference = false, kto = false;
  int64_t kl_batch_size = 8;
  std::string truncation_mode = "keep_start";
  std::string format = "auto", fields, train_on = "assistant", too_long = "drop", on_error = "stop";
};

void add_chat_options(CLI::App* cmd, data::PrepareOptions& o, ChatFlags& f) {
  auto* on = cmd->add_flag("--chat", f.chat,
                           "Each JSON example is a conversation (chosen by itself when the first line holds one and --tokenizer is given)");
  cmd->add_flag("--no-chat", f.no_chat, "Read JSON Lines as plain text (--json-key) even when they hold conversations")->excludes(on);
  cmd->add_option("--chat-format", f.format, "auto (per line), openai (messages), sharegpt (conversations) or alpaca (instruction/output)")
      ->check(CLI::IsMember({"auto", "openai", "sharegpt", "alpaca"}));
  cmd->add_option("--chat-fields", f.fields,
                  "Rename the fields read, NAME=KEY comma-separated: messages, role, content, conversations, from, value, "
                  "instruction, input, output, system, history, train");
  cmd->add_option("--chat-template", o.chat.chat_template,
                  "The chat template: a .jinja file or a tokenizer_config.json (default: the --tokenizer folder's own)");
  cmd->add_option("--template-name", o.chat.template_name, "Which of a tokenizer's named templates (default: default)");
  cmd->add_option("--template", o.chat.builtin,
                  "A built-in template instead: deepseek-coder-finetune (DeepSeek-Coder's finetune script, byte for byte)");
  cmd->add_option("--train-on", f.train_on,
                  "assistant (every assistant turn, its end-of-turn token included), last (the last assistant turn) or all "
                  "tokens; a message's own \"train\": false/true wins")
      ->check(CLI::IsMember({"assistant", "last", "all"}));
  cmd->add_option("--end-of-turn", o.chat.encode.end_of_turn,
                  "The token that ends an assistant turn (default: tokenizer_config.json's eos_token); must be one token");
  cmd->add_option("--max-length", o.chat.encode.max_length, "Longest conversation in tokens (0: no limit); see --too-long")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--too-long", f.too_long, "drop (default) or truncate a conversation over --max-length (its end-of-turn token kept)")
      ->check(CLI::IsMember({"drop", "truncate"}));
  cmd->add_flag("--last-turn-verbatim", o.chat.encode.last_turn_verbatim,
                "Write the last assistant message as given after the generation prompt, not as the template renders it "
                "(for templates that cut it, such as R1's reasoning)");
  cmd->add_option("--on-error", f.on_error, "stop (default: name the file and line) or skip (drop and count) bad conversations")
      ->check(CLI::IsMember({"stop", "skip"}));
}

// --preference: chosen/rejected pairs, tokenized as TRL's DPOTrainer does.
void add_preference_options(CLI::App* cmd, ChatFlags& f) {
  cmd->add_flag("--preference", f.preference,
                "Each JSON row is a preference pair as TRL reads it ({prompt, chosen, rejected}: lists of messages or strings; "
                "without prompt, chosen and rejected share it): two documents per pair, the loss mask over the completions");
  cmd->add_option("--truncation-mode", f.truncation_mode,
                  "With --preference and --max-length: keep_start (default: cut each sequence's end; a pair whose prompt alone "
                  "fills --max-length is dropped) or keep_end (cut the start), as TRL's truncation_mode")
      ->check(CLI::IsMember({"keep_start", "keep_end"}));
  cmd->add_flag("--kto", f.kto,
                "With --preference: an unpaired set for train.objective kto, as TRL's KTOTrainer builds it: rows {prompt, completion, "
                "label: true|false}, or pairs split into a desirable and an undesirable example; each example is stored with "
                "its KL sequence (its prompt with another example's completion)");
  auto* kl = cmd->add_option("--kl-batch-size", f.kl_batch_size,
                             "With --kto: the KL completions rotate by one within each run of this many examples in set order "
                             "(TRL's per_device_train_batch_size; default 8). Use train.micro_batch_size to match TRL")
                 ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  kl->needs(cmd->get_option("--kto"));
}

void apply_chat_flags(const ChatFlags& f, data::PrepareOptions& o) {
  o.preference.on = f.preference;
  o.preference.kto = f.kto, o.preference.kl_batch_size = f.kl_batch_size;
  if (f.kto && !f.preference) throw Error(ErrorCode::kUsage, "--kto goes with --preference", "pass --preference --kto");
  if (f.kto && f.truncation_mode != "keep_start")
    throw Error(ErrorCode::kUsage, "--truncation-mode keep_end does not go with --kto",
                "TRL's KTOTrainer cuts each sequence from the right (keep_start); leave --truncation-mode out");
  o.preference.encode.max_length = o.chat.encode.max_length;
  o.preference.encode.keep_end = f.truncation_mode == "keep_end";
  if (f.truncation_mode != "keep_start" && !f.preference)
    throw Error(ErrorCode::kUsage, "--truncation-mode goes with --preference", "conversations use --too-long drop|truncate");
  o.chat.mode = f.chat ? data::ChatMode::kOn : f.no_chat ? data::ChatMode::kOff : data::ChatMode::kAuto;
  o.chat.format = f.format == "openai"     ? data::ChatFormat::kOpenAI
                  : f.format == "sharegpt" ? data::ChatFormat::kShareGPT
                  : f.format == "alpaca"   ? data::ChatFormat::kAlpaca
                                           : data::ChatFormat::kAuto;
  for (const auto& field : split_commas(f.fields)) data::set_chat_field(o.chat.fields, field);
  o.chat.encode.train_on = f.train_on == "all"    ? data::TrainOn::kAll
                           : f.train_on == "last" ? data::TrainOn::kLastAssistant
                                                  : data::TrainOn::kAssistant;
  o.chat.encode.overlength = f.too_long == "truncate" ? data::Overlength::kTruncate : data::Overlength::kDrop;
  o.chat.skip_errors = f.on_error == "skip";
  const bool chat_flags = f.format != "auto" || !f.fields.empty() || !o.chat.chat_template.empty() || !o.chat.builtin.empty() ||
                          f.train_on != "assistant" || !o.chat.encode.end_of_turn.empty() || o.chat.encode.max_length > 0 ||
                          o.chat.encode.last_turn_verbatim || o.chat.skip_errors;
  if (chat_flags && f.no_chat) throw Error(ErrorCode::kUsage, "--no-chat and the conversation flags do not go together", "");
}

void print_chat_summary(const data::PrepareSummary& s) {
  const data::ChatCounts& c = s.chat_counts;
  for (const auto& o : s.outputs)
    fmt::print("wrote {}.lossmask: {} of {} tokens trained ({:.1f}%); chat template {}, end of turn '{}'\n", o.prefix, o.trained_tokens,
               o.tokens, o.tokens ? 100.0 * static_cast<double>(o.trained_tokens) / static_cast<double>(o.tokens) : 0.0, s.chat_template,
               s.end_of_turn);
  fmt::print("{}\n", data::chat_counts_line(c));
  if (c.rewrites_history)
    fmt::print(
        "warning: in {} conversations (the first: {}) the chat template does not render a trained message as written (e.g. R1's "
        "template cuts the reasoning before </think> from assistant turns): those turns are trained as the template renders "
        "them, or not at all where a later turn changed them; pass --train-on last --last-turn-verbatim to train each "
        "conversation's final answer as written\n",
        c.rewrites_history, c.first_rewrite);
  if (c.doubled_bos) fmt::print("warning: {} conversations rendered two BOS tokens at the start; one was removed\n", c.doubled_bos);
}

void print_summary(const data::PrepareSummary& s) {
  for (const auto& o : s.outputs)
    fmt::print("wrote {}.bin and {}.idx{}: {} documents, {} tokens; crc32c bin {:08x} idx {:08x}\n", o.prefix, o.prefix,
               o.key.empty() ? "" : fmt::format(" (key '{}')", o.key), o.documents, o.tokens, o.bin_crc32c, o.idx_crc32c);
  fmt::print("tokenizer: {}; vocab {}, end-of-document {}\n", s.tokenizer, s.vocab_size, s.end_of_document);
  const double mb = static_cast<double>(s.input_bytes) / 1e6;
  fmt::print("{:.1f} MB in {:.2f} s with {} workers: {:.1f} MB/s, {:.2f} M tokens/s\n", mb, s.seconds, s.workers,
             s.seconds > 0 ? mb / s.seconds : 0.0, s.seconds > 0 ? static_cast<double>(s.tokens) / 1e6 / s.seconds : 0.0);
  if (s.chat) print_chat_summary(s);
  if (s.preference) {
    for (const auto& o : s.outputs)
      fmt::print("wrote {}.lossmask: {} of {} tokens are completions; {}\n", o.prefix, o.trained_tokens, o.tokens,
                 s.chat_template.empty() ? "text rows" : "chat template " + s.chat_template);
    fmt::print("{}\n", data::preference_counts_line(s.preference_counts));
  }
  if (s.empty_documents) fmt::print("skipped {} empty documents\n", s.empty_documents);
  if (s.repaired_utf8) fmt::print("replaced {} invalid UTF-8 sequences with U+FFFD (as Python's errors=\"replace\")\n", s.repaired_utf8);
  if (s.dropped_characters)
    fmt::print("warning: {} characters had no token and were dropped (as Hugging Face tokenizers drops them)\n", s.dropped_characters);
}

}  // namespace

void register_prepare_data(CLI::App& app, Run& run) {
  auto o = std::make_shared<data::PrepareOptions>();
  auto ext = std::make_shared<std::string>();
  auto keys = std::make_shared<std::vector<std::string>>();
  auto format = std::make_shared<std::string>("auto");
  auto chat = std::make_shared<ChatFlags>();
  CLI::App* cmd = app.add_subcommand("prepare-data", "Tokenize text or JSON Lines into a Megatron dataset for training");
  cmd->footer(
      "Without --tokenizer, every document becomes its bytes (tokens 0-255) and an end-of-document token\n"
      "256 (vocab 257). With --tokenizer, a Hugging Face tokenizer.json (BPE: byte-level as DeepSeek,\n"
      "GPT-2 and Llama 3 use, or with byte_fallback) gives the same ids as the `tokenizers` package,\n"
      "with the post-processor's special tokens (e.g. BOS), and the end-of-document token after each\n"
      "document. Components dstrain does not implement are refused by name.\n\n"
      "Inputs: text files (one document each), JSON Lines (.jsonl/.ndjson: one document per line, the\n"
      "--json-key field), either gzip-compressed, Apache Parquet (.parquet: each row as a JSON line;\n"
      "lists and structs as JSON), folders (walked recursively in sorted order) and - for stdin.\n"
      "Writes PREFIX.bin, PREFIX.idx (Megatron's indexed format: uint16 below 65500 ids, else int32),\n"
      "PREFIX.json (vocab size, end-of-document id, tokenizer hash, counts, CRC-32C) and\n"
      "PREFIX.tokenizer/ (the tokenizer's files, for inspect-data --decode and export-hf). With several\n"
      "--json-key values, one dataset per key: PREFIX_KEY.*, as Megatron's preprocess_data.py does.\n"
      "The output is identical whatever --workers is. Train with data: {format: megatron, path: PREFIX}\n"
      "and model.vocab_size at least the dataset's vocab size (train checks it).\n\n"
      "Conversations (--chat, chosen by itself when the first JSON line holds one): OpenAI-style\n"
      "messages, ShareGPT conversations, Alpaca and DeepSeek-Coder instruction/output, one per JSON\n"
      "line or as a .json array. Each is rendered with the tokenizer's own chat template exactly as\n"
      "transformers' apply_chat_template renders it (or --chat-template FILE, or --template\n"
      "deepseek-coder-finetune), tokenized without extra special tokens, and written as one document\n"
      "with PREFIX.lossmask: a byte per token, 1 where the model learns (by default every assistant\n"
      "turn with its end-of-turn token, found by rendering each prefix). A conversation that is\n"
      "malformed or that the template refuses stops the run with its file and line (exit 3), leaving\n"
      "no files, unless --on-error skip; one with nothing to train is dropped and counted; --max-length\n"
      "drops or truncates, counted in PREFIX.json. An end-of-turn string that is not one token, or a\n"
      "template whose assistant turns lack it, is an error (exit 2): the model would never stop.\n"
      "The template that rendered them goes into PREFIX.tokenizer/tokenizer_config.json, so that\n"
      "export-hf of a model trained on them ships the template it was trained with.\n\n"
      "Preference pairs (--preference, for train.objective dpo, cpo, simpo, orpo or reward): TRL's rows\n"
      "{prompt, chosen, rejected} as lists of messages or as strings (or chosen/rejected alone, sharing\n"
      "the prompt), tokenized\n"
      "exactly as TRL's DPOTrainer does: the prompt with the generation prompt, prompt + completion\n"
      "rendered whole, the completion from where the two token lists diverge; text rows get the eos\n"
      "token. Each pair is two documents (prompt + chosen, prompt + rejected) with the completions in\n"
      "PREFIX.lossmask. --max-length cuts each sequence (--truncation-mode); pairs with chosen equal\n"
      "to rejected are counted and named. A \"margin\" per row (a number, TRL's reward margin) is kept\n"
      "for train.objective reward: every row has one, or none does.\n\n"
      "KTO examples (--preference --kto, for train.objective kto): rows {prompt, completion, label}\n"
      "(label true: a desirable completion), or pairs, unpaired as TRL does (each chunk of 1000 rows\n"
      "gives its chosen completions, desirable, then its rejected ones), tokenized as TRL's KTOTrainer\n"
      "does. Each example is stored with its KL sequence: its prompt with the completion of the\n"
      "example before it in its run of --kl-batch-size (TRL's per-device batch), as TRL builds them.\n"
      "An example whose prompt alone fills --max-length is dropped; each sequence is cut from the right.\n\n"
      "Examples:\n"
      "  dstrain prepare-data notes.txt book.txt --output data/text\n"
      "  dstrain prepare-data /usr/lib/python3.11 --ext .py --output data/pycode --max-bytes 50000000\n"
      "  dstrain prepare-data corpus/ --ext .jsonl.gz --tokenizer deepseek-v3/ --output data/corpus --workers 16\n"
      "  zcat dump.jsonl.gz | dstrain prepare-data - --input-format jsonl --tokenizer tok.json --output data/dump\n"
      "  dstrain prepare-data chats.jsonl --chat --tokenizer deepseek-llm-7b-chat/ --output data/sft --max-length 4096\n"
      "  dstrain prepare-data pairs.jsonl --preference --tokenizer deepseek-llm-7b-chat/ --output data/dpo --max-length 1024\n"
      "  dstrain prepare-data pairs.jsonl --preference --kto --kl-batch-size 8 --tokenizer deepseek-llm-7b-chat/ --output data/kto\n"
      "  dstrain prepare-data evol.jsonl --tokenizer deepseek-coder-6.7b-instruct/ --template deepseek-coder-finetune --output data/evol");
  cmd->add_option("inputs", o->inputs, "Text or JSON Lines files (.gz too), folders, - for stdin")->required();
  cmd->add_option("--output", o->output_prefix, "Output prefix (PREFIX.bin, PREFIX.idx, PREFIX.json)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "A Hugging Face tokenizer.json or its folder (default: byte-level, vocab 257)");
  cmd->add_option("--eod-token", o->end_of_document,
                  "The token written after each document (default: tokenizer_config.json's eos_token, else <|endoftext|>, "
                  "DeepSeek's, Llama 3's or </s>)");
  cmd->add_option("--json-key", *keys, "JSON Lines field(s) holding the text (default: text); several give one dataset each");
  cmd->add_option("--input-format", *format, "auto (by extension: .jsonl/.ndjson[.gz] are JSON Lines, .parquet Parquet), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  cmd->add_option("--workers", o->workers, "Tokenizer threads (default: every core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--ext", *ext, "Only files ending in these suffixes, comma-separated (e.g. .py,.md or .jsonl.gz)");
  cmd->add_option("--max-bytes", o->max_bytes, "Stop after this many input bytes, counted after decompression (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-line-bytes", o->max_line_bytes,
                  "The longest JSON line (or compressed text file or stdin, read as one document) after decompression; a longer "
                  "one is an error naming it (default 268435456: 256 MiB)")
      ->check(CLI::PositiveNumber);
  add_chat_options(cmd, *o, *chat);
  add_preference_options(cmd, *chat);
  cmd->callback([o, ext, keys, format, chat, &run] {
    run = [o, ext, keys, format, chat] {
      apply_chat_flags(*chat, *o);
      o->extensions = split_commas(*ext);
      if (!keys->empty()) o->json_keys = *keys;
      o->input_format = *format == "text"    ? data::InputFormat::kText
                        : *format == "jsonl" ? data::InputFormat::kJsonl
                                             : data::InputFormat::kAuto;
      const bool tty = ::isatty(STDERR_FILENO);
      train::StepTriggers::install_signal_handlers();  // Ctrl-C: stop between batches, temporaries removed
      o->stop_requested = [] { return train::StepTriggers::stop_signal_received(); };
      const auto summary = data::prepare_dataset(*o, [tty](const data::PrepareProgress& p) {
        if (!tty || p.seconds <= 0) return;
        std::fprintf(stderr, "\r%.1f MB  %.1f MB/s  %lld documents  %.2f M tokens  %.2f M tokens/s   ", static_cast<double>(p.bytes) / 1e6,
                     static_cast<double>(p.bytes) / 1e6 / p.seconds, static_cast<long long>(p.documents),
                     static_cast<double>(p.tokens) / 1e6, static_cast<double>(p.tokens) / 1e6 / p.seconds);
      });
      if (tty) std::fprintf(stderr, "\n");
      print_summary(summary);
      return 0;
    };
  });
}

}  // namespace dstrain::app
