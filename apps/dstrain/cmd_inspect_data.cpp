#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "commands.h"
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/core/error.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/token_file.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::app {
namespace {

// The first `count` documents of `file` as text: through the tokenizer named by --tokenizer or
// by the dataset's PREFIX.json, or byte by byte for prepare-data's byte-level datasets.
// A document's text with its trained spans between [[ and ]].
std::string marked_text(const text::Tokenizer& tokenizer, const std::vector<uint32_t>& ids, const uint8_t* mask) {
  std::string out;
  for (size_t a = 0; a < ids.size();) {
    size_t b = a;
    while (b < ids.size() && mask[b] == mask[a]) ++b;
    const std::string piece =
        tokenizer.decode(std::vector<uint32_t>(ids.begin() + static_cast<std::ptrdiff_t>(a), ids.begin() + static_cast<std::ptrdiff_t>(b)));
    out += mask[a] ? "[[" + piece + "]]" : piece;
    a = b;
  }
  return out;
}

void print_documents(const data::TokenFile& file, const std::string& path, const std::string& tokenizer_path, int64_t count,
                     const data::LossMask* mask) {
  const auto sidecar = config::read_dataset_sidecar(path);
  std::string from = tokenizer_path;
  if (from.empty() && sidecar && sidecar->tokenizer == "huggingface") from = sidecar->tokenizer_dir;
  const bool bytes = from.empty() && sidecar && sidecar->tokenizer == "bytes+eos";
  if (from.empty() && !bytes)
    throw Error(ErrorCode::kUsage, fmt::format("no tokenizer is known for '{}'", path),
                "pass the tokenizer it was prepared with: --tokenizer tokenizer.json (or its folder)");
  std::shared_ptr<const text::Tokenizer> tokenizer;
  if (!bytes) tokenizer = text::Tokenizer::load(from);
  const auto& starts = file.document_starts();
  for (int64_t d = 0; d < count && d < static_cast<int64_t>(starts.size()); ++d) {
    const int64_t begin = starts[static_cast<size_t>(d)];
    const int64_t end = d + 1 < static_cast<int64_t>(starts.size()) ? starts[static_cast<size_t>(d) + 1] : file.size();
    std::vector<uint32_t> ids;
    std::string text;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = file.at(i);
      if (t < 0 || t > 0xffffffffLL) throw Error(ErrorCode::kData, fmt::format("{}: token {} at offset {} is not an id", path, t, i), "");
      if (bytes) {
        text += t < 256 ? std::string(1, static_cast<char>(t)) : fmt::format("<|endoftext:{}|>", t);
      } else {
        ids.push_back(static_cast<uint32_t>(t));
      }
    }
    if (tokenizer) text = mask ? marked_text(*tokenizer, ids, mask->values() + begin) : tokenizer->decode(ids);
    std::string trained;
    if (mask) trained = fmt::format(", {} trained", std::count(mask->values() + begin, mask->values() + end, uint8_t{1}));
    fmt::print("--- document {} ({} tokens{}) ---\n{}\n", d, end - begin, trained, text);
  }
}

}  // namespace

void register_inspect_data(CLI::App& app, Run& run) {
  auto path = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("megatron");
  auto head = std::make_shared<int64_t>(16);
  auto decode = std::make_shared<int64_t>(0);
  auto tokenizer = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect-data", "Show what a token file holds: tokens, documents, the first tokens");
  cmd->footer(
      "Opens the file as training would (memory-mapped, validated) and prints its token and document\n"
      "counts and the first tokens. With --decode N, also the first N documents as text, through the\n"
      "tokenizer prepare-data copied beside the dataset (PREFIX.tokenizer/) or the one given with\n"
      "--tokenizer. A fine-tuning set's loss mask (PREFIX.lossmask, from prepare-data --chat) is checked\n"
      "against PREFIX.json, and --decode shows the trained spans between [[ and ]].\n"
      "Exit status 3 when the file is missing or malformed.\n\n"
      "Examples:\n"
      "  dstrain inspect-data data/pycode --format megatron\n"
      "  dstrain inspect-data fineweb_train_000001.bin --format llmc --head 32\n"
      "  dstrain inspect-data data/corpus --decode 3");
  cmd->add_option("path", *path, "Data file (for megatron: the prefix or either file)")->required();
  cmd->add_option("--format", *format, "bytes, megatron, llmc or raw_u16")->check(CLI::IsMember(config::enum_names<config::DataFormat>()));
  cmd->add_option("--head", *head, "How many tokens to print")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--decode", *decode, "Print the first N documents decoded to text")->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--tokenizer", *tokenizer, "The tokenizer.json (or folder) to decode with (default: the dataset's own)");
  cmd->callback([path, format, head, decode, tokenizer, &run] {
    run = [path, format, head, decode, tokenizer] {
      config::DataFormat data_format{};
      config::parse_enum(*format, data_format);  // CLI11 checked the name
      const auto file = data::open_token_file(*path, data_format, 0);
      std::vector<int64_t> first;
      for (int64_t i = 0; i < std::min(*head, file->size()); ++i) first.push_back(file->at(i));
      fmt::print("file       {}\nformat     {}\ntokens     {}\ndocuments  {}\nfirst      [{}]\n", file->path(), *format, file->size(),
                 file->document_starts().empty() ? std::string("(no document boundaries in this format)")
                                                 : std::to_string(file->document_starts().size()),
                 fmt::join(first, ", "));
      std::unique_ptr<data::LossMask> mask;
      const std::string prefix = config::megatron_prefix(*path);
      if (data_format == config::DataFormat::kMegatron && data::has_loss_mask(prefix)) {
        // open_token_file checked the mask against PREFIX.json (data/dataset_set.h).
        mask = std::make_unique<data::LossMask>(prefix, file->size());
        const int64_t trained = std::count(mask->values(), mask->values() + file->size(), uint8_t{1});
        fmt::print("loss mask  {}: {} of {} tokens trained ({:.1f}%), size and CRC-32C as {}.json records\n", mask->path(), trained,
                   file->size(), file->size() ? 100.0 * static_cast<double>(trained) / static_cast<double>(file->size()) : 0.0, prefix);
      }
      if (*decode > 0) print_documents(*file, *path, *tokenizer, *decode, mask.get());
      return 0;
    };
  });
}

}  // namespace dstrain::app
