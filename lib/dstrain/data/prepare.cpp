#include "dstrain/data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"

namespace dstrain::data {
namespace fs = std::filesystem;

namespace {

bool wanted(const fs::path& p, const std::vector<std::string>& extensions) {
  if (extensions.empty()) return true;
  const std::string name = p.filename().string();
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) {
    return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  });
}

void append(std::string& out, const void* v, size_t n) { out.append(static_cast<const char*>(v), n); }

}  // namespace

PrepareSummary prepare_bytes_dataset(const PrepareOptions& o, const std::function<void(int64_t, int64_t)>& progress) {
  std::vector<fs::path> files;
  for (const auto& input : o.inputs) {
    if (fs::is_regular_file(input)) {
      files.emplace_back(input);
    } else if (fs::is_directory(input)) {
      for (const auto& e : fs::recursive_directory_iterator(input, fs::directory_options::skip_permission_denied))
        if (e.is_regular_file() && wanted(e.path(), o.extensions)) files.push_back(e.path());
    } else {
      throw Error(ErrorCode::kData, fmt::format("input '{}' does not exist", input), "pass text files or directories");
    }
  }
  std::sort(files.begin(), files.end());  // the same dataset from the same inputs, on every machine
  if (files.empty()) throw Error(ErrorCode::kData, "no input files matched", "check the paths and --ext");

  // Stream tokens into the .bin (uint16) and keep only the lengths for the .idx.
  const std::string bin_path = o.output_prefix + ".bin", tmp = bin_path + ".tmp";
  if (const auto parent = fs::path(bin_path).parent_path(); !parent.empty()) fs::create_directories(parent);
  std::ofstream bin(tmp, std::ios::binary | std::ios::trunc);
  if (!bin) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}'", tmp), "check the output directory");
  PrepareSummary summary;
  std::vector<int32_t> lengths;
  std::vector<uint16_t> buffer;
  int64_t input_bytes = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;  // unreadable files are skipped, as directories of sources often hold some
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.empty()) continue;
    buffer.assign(text.begin(), text.end());
    for (size_t i = 0; i < text.size(); ++i) buffer[i] = static_cast<uint8_t>(text[i]);
    buffer.push_back(static_cast<uint16_t>(kByteEos));
    if (buffer.size() > 0x7fffffff) continue;  // Megatron lengths are int32
    bin.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer.size() * 2));
    summary.bin_crc32c = crc32c(buffer.data(), buffer.size() * 2, summary.bin_crc32c);
    lengths.push_back(static_cast<int32_t>(buffer.size()));
    summary.documents += 1;
    summary.tokens += static_cast<int64_t>(buffer.size());
    input_bytes += static_cast<int64_t>(text.size());
    if (progress && summary.documents % 64 == 0) progress(summary.documents, summary.tokens);
    if (o.max_bytes > 0 && input_bytes >= o.max_bytes) break;
  }
  bin.flush();
  if (!bin) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}'", tmp), "check free disk space");
  bin.close();
  fsync_path(tmp);
  rename_atomic(tmp, bin_path);

  std::string idx("MMIDIDX\0\0", 9);
  const uint64_t version = 1, seqs = lengths.size(), docs = lengths.size() + 1;
  append(idx, &version, 8);
  idx += static_cast<char>(8);  // uint16
  append(idx, &seqs, 8);
  append(idx, &docs, 8);
  append(idx, lengths.data(), lengths.size() * 4);
  int64_t pointer = 0;
  for (int32_t len : lengths) append(idx, &pointer, 8), pointer += int64_t{len} * 2;
  for (uint64_t i = 0; i < docs; ++i) {
    const int64_t v = static_cast<int64_t>(i);
    append(idx, &v, 8);
  }
  summary.idx_crc32c = crc32c(idx.data(), idx.size());
  write_file_atomic(o.output_prefix + ".idx", idx);
  write_file_atomic(
      o.output_prefix + ".json",
      fmt::format("{{\"format\": \"megatron\", \"tokenizer\": \"bytes+eos\", \"vocab_size\": {}, \"eos\": {}, \"documents\": {}, "
                  "\"tokens\": {}, \"crc32c_bin\": \"{:08x}\", \"crc32c_idx\": \"{:08x}\"}}\n",
                  kByteVocab, kByteEos, summary.documents, summary.tokens, summary.bin_crc32c, summary.idx_crc32c));
  if (progress) progress(summary.documents, summary.tokens);
  return summary;
}

}  // namespace dstrain::data
