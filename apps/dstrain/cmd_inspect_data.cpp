#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "commands.h"
#include "dstrain/data/token_file.h"

namespace dstrain::app {

void register_inspect_data(CLI::App& app, Run& run) {
  auto path = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("megatron");
  auto head = std::make_shared<int64_t>(16);
  CLI::App* cmd = app.add_subcommand("inspect-data", "Show what a token file holds: tokens, documents, the first tokens");
  cmd->footer(
      "Opens the file as training would (memory-mapped, validated) and prints its token and document\n"
      "counts and the first tokens. Exit status 3 when the file is missing or malformed.\n\n"
      "Examples:\n"
      "  dstrain inspect-data data/pycode --format megatron\n"
      "  dstrain inspect-data fineweb_train_000001.bin --format llmc --head 32");
  cmd->add_option("path", *path, "Data file (for megatron: the prefix or either file)")->required();
  cmd->add_option("--format", *format, "bytes, megatron, llmc or raw_u16")->check(CLI::IsMember(config::enum_names<config::DataFormat>()));
  cmd->add_option("--head", *head, "How many tokens to print")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->callback([path, format, head, &run] {
    run = [path, format, head] {
      config::DataFormat data_format{};
      config::parse_enum(*format, data_format);  // CLI11 checked the name
      const auto file = data::open_token_file(*path, data_format, 0);
      std::vector<int64_t> first;
      for (int64_t i = 0; i < std::min(*head, file->size()); ++i) first.push_back(file->at(i));
      fmt::print("file       {}\nformat     {}\ntokens     {}\ndocuments  {}\nfirst      [{}]\n", file->path(), *format, file->size(),
                 file->document_starts().empty() ? std::string("(no document boundaries in this format)")
                                                 : std::to_string(file->document_starts().size()),
                 fmt::join(first, ", "));
      return 0;
    };
  });
}

}  // namespace dstrain::app
