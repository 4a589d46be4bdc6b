#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

#include "commands.h"
#include "dstrain/data/prepare.h"

namespace dstrain::app {

void register_prepare_data(CLI::App& app, Run& run) {
  auto o = std::make_shared<data::PrepareOptions>();
  auto ext = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("prepare-data", "Turn text files into a byte-level Megatron dataset for training");
  cmd->footer(
      "Every file becomes one document: its bytes (tokens 0-255) and an end-of-document token 256\n"
      "(vocab 257, uint16). Writes PREFIX.bin and PREFIX.idx (Megatron's indexed format) and PREFIX.json\n"
      "(documents, tokens, CRC-32C of both files). Directories are walked recursively in sorted order,\n"
      "so the same inputs give the same dataset on every machine. Train on it with\n"
      "data: {format: megatron, path: PREFIX} and model.vocab_size >= 257.\n\n"
      "Examples:\n"
      "  dstrain prepare-data notes.txt book.txt --output data/text\n"
      "  dstrain prepare-data /usr/lib/python3.11 --ext .py --output data/pycode --max-bytes 50000000");
  cmd->add_option("inputs", o->inputs, "Text files and directories")->required();
  cmd->add_option("--output", o->output_prefix, "Output prefix (PREFIX.bin, PREFIX.idx, PREFIX.json)")->required();
  cmd->add_option("--ext", *ext, "Only files ending in these suffixes, comma-separated (e.g. .py,.md)");
  cmd->add_option("--max-bytes", o->max_bytes, "Stop after this many input bytes (0: all)")->check(CLI::NonNegativeNumber);
  cmd->callback([o, ext, &run] {
    run = [o, ext] {
      for (size_t start = 0; !ext->empty() && start <= ext->size();) {
        const size_t comma = std::min(ext->find(',', start), ext->size());
        if (comma > start) o->extensions.push_back(ext->substr(start, comma - start));
        start = comma + 1;
      }
      const bool tty = ::isatty(STDERR_FILENO);
      const auto summary = data::prepare_bytes_dataset(*o, [tty](int64_t docs, int64_t tokens) {
        if (tty) std::fprintf(stderr, "\r%lld documents, %lld tokens", static_cast<long long>(docs), static_cast<long long>(tokens));
      });
      if (tty) std::fprintf(stderr, "\n");
      fmt::print("wrote {}.bin and {}.idx: {} documents, {} tokens (vocab {}, end-of-document {}); crc32c bin {:08x} idx {:08x}\n",
                 o->output_prefix, o->output_prefix, summary.documents, summary.tokens, data::kByteVocab, data::kByteEos,
                 summary.bin_crc32c, summary.idx_crc32c);
      return 0;
    };
  });
}

}  // namespace dstrain::app
