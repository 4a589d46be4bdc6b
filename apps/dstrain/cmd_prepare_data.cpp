#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/data/prepare.h"

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

void print_summary(const data::PrepareSummary& s) {
  for (const auto& o : s.outputs)
    fmt::print("wrote {}.bin and {}.idx{}: {} documents, {} tokens; crc32c bin {:08x} idx {:08x}\n", o.prefix, o.prefix,
               o.key.empty() ? "" : fmt::format(" (key '{}')", o.key), o.documents, o.tokens, o.bin_crc32c, o.idx_crc32c);
  fmt::print("tokenizer: {}; vocab {}, end-of-document {}\n", s.tokenizer, s.vocab_size, s.end_of_document);
  const double mb = static_cast<double>(s.input_bytes) / 1e6;
  fmt::print("{:.1f} MB in {:.2f} s with {} workers: {:.1f} MB/s, {:.2f} M tokens/s\n", mb, s.seconds, s.workers,
             s.seconds > 0 ? mb / s.seconds : 0.0, s.seconds > 0 ? static_cast<double>(s.tokens) / 1e6 / s.seconds : 0.0);
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
  CLI::App* cmd = app.add_subcommand("prepare-data", "Tokenize text or JSON Lines into a Megatron dataset for training");
  cmd->footer(
      "Without --tokenizer, every document becomes its bytes (tokens 0-255) and an end-of-document token\n"
      "256 (vocab 257). With --tokenizer, a Hugging Face tokenizer.json (BPE: byte-level as DeepSeek,\n"
      "GPT-2 and Llama 3 use, or with byte_fallback) gives the same ids as the `tokenizers` package,\n"
      "with the post-processor's special tokens (e.g. BOS), and the end-of-document token after each\n"
      "document. Components dstrain does not implement are refused by name.\n\n"
      "Inputs: text files (one document each), JSON Lines (.jsonl/.ndjson: one document per line, the\n"
      "--json-key field), either gzip-compressed, folders (walked recursively in sorted order) and - for\n"
      "stdin. Writes PREFIX.bin, PREFIX.idx (Megatron's indexed format: uint16 below 65500 ids, else\n"
      "int32), PREFIX.json (vocab size, end-of-document id, tokenizer hash, counts, CRC-32C) and\n"
      "PREFIX.tokenizer/ (the tokenizer's files, for inspect-data --decode and export-hf). With several\n"
      "--json-key values, one dataset per key: PREFIX_KEY.*, as Megatron's preprocess_data.py does.\n"
      "The output is identical whatever --workers is. Train with data: {format: megatron, path: PREFIX}\n"
      "and model.vocab_size at least the dataset's vocab size (train checks it).\n\n"
      "Examples:\n"
      "  dstrain prepare-data notes.txt book.txt --output data/text\n"
      "  dstrain prepare-data /usr/lib/python3.11 --ext .py --output data/pycode --max-bytes 50000000\n"
      "  dstrain prepare-data corpus/ --ext .jsonl.gz --tokenizer deepseek-v3/ --output data/corpus --workers 16\n"
      "  zcat dump.jsonl.gz | dstrain prepare-data - --input-format jsonl --tokenizer tok.json --output data/dump");
  cmd->add_option("inputs", o->inputs, "Text or JSON Lines files (.gz too), folders, - for stdin")->required();
  cmd->add_option("--output", o->output_prefix, "Output prefix (PREFIX.bin, PREFIX.idx, PREFIX.json)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "A Hugging Face tokenizer.json or its folder (default: byte-level, vocab 257)");
  cmd->add_option("--eod-token", o->end_of_document,
                  "The token written after each document (default: tokenizer_config.json's eos_token, else <|endoftext|>, "
                  "DeepSeek's, Llama 3's or </s>)");
  cmd->add_option("--json-key", *keys, "JSON Lines field(s) holding the text (default: text); several give one dataset each");
  cmd->add_option("--input-format", *format, "auto (by extension: .jsonl/.ndjson[.gz] are JSON Lines), text or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}));
  cmd->add_option("--workers", o->workers, "Tokenizer threads (default: every core)")->check(CLI::Range(0, 1024));
  cmd->add_option("--ext", *ext, "Only files ending in these suffixes, comma-separated (e.g. .py,.md or .jsonl.gz)");
  cmd->add_option("--max-bytes", o->max_bytes, "Stop after this many input bytes (0: all)")->check(CLI::NonNegativeNumber);
  cmd->callback([o, ext, keys, format, &run] {
    run = [o, ext, keys, format] {
      o->extensions = split_commas(*ext);
      if (!keys->empty()) o->json_keys = *keys;
      o->input_format = *format == "text"    ? data::InputFormat::kText
                        : *format == "jsonl" ? data::InputFormat::kJsonl
                                             : data::InputFormat::kAuto;
      const bool tty = ::isatty(STDERR_FILENO);
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
