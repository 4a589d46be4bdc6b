#include "dstrain/data/token_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/data/dataset_set.h"
#include "dstrain/data/mapped_file.h"

namespace dstrain::data {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kData, fmt::format("data file '{}': {}", path, what),
              "check data.path and data.format in the recipe; re-create the file if it is damaged");
}

using Mapping = MappedFile;

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian, as the formats are
  return v;
}

// A float token as an integer; kNotWhole for NaN, infinities, fractions and values no vocabulary
// has (converting those to int64 would be undefined behaviour).
int64_t whole(double v) {
  if (!(std::fabs(v) < 9.0e15) || v != std::floor(v)) return kNotWhole;
  return static_cast<int64_t>(v);
}

int64_t element(const uint8_t* base, int code, int64_t i) {
  switch (code) {
    case 1:
      return base[i];
    case 2:
      return static_cast<int8_t>(base[i]);
    case 3:
      return read_le<int16_t>(base + 2 * i);
    case 4:
      return read_le<int32_t>(base + 4 * i);
    case 5:
      return read_le<int64_t>(base + 8 * i);
    case 6:
      return whole(read_le<double>(base + 8 * i));
    case 7:
      return whole(read_le<float>(base + 4 * i));
    case 8:
      return read_le<uint16_t>(base + 2 * i);
  }
  return 0;
}

int itemsize(int code) {
  static const int sizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  return code >= 1 && code <= 8 ? sizes[code] : 0;
}

class BytesFile final : public TokenFile {
 public:
  explicit BytesFile(const std::string& path) : map_(path) { path_ = path, size_ = static_cast<int64_t>(map_.size()); }
  int64_t at(int64_t i) const override { return map_.bytes()[i]; }

 private:
  Mapping map_;
};

class RawU16File final : public TokenFile {
 public:
  explicit RawU16File(const std::string& path) : map_(path) {
    path_ = path;
    if (map_.size() % 2 != 0) bad(path, fmt::format("{} bytes is not a whole number of uint16 tokens", map_.size()));
    size_ = static_cast<int64_t>(map_.size() / 2);
  }
  int64_t at(int64_t i) const override { return read_le<uint16_t>(map_.bytes() + 2 * i); }

 private:
  Mapping map_;
};

class LlmcFile final : public TokenFile {
 public:
  explicit LlmcFile(const std::string& path) : map_(path) {
    path_ = path;
    if (map_.size() < 1024) bad(path, fmt::format("{} bytes is shorter than the 1024-byte llm.c header", map_.size()));
    const int32_t magic = read_le<int32_t>(map_.bytes()), version = read_le<int32_t>(map_.bytes() + 4),
                  ntok = read_le<int32_t>(map_.bytes() + 8);
    if (magic == 20240520 && version == 1)
      width_ = 2;
    else if (magic == 20240801 && version == 7)
      width_ = 4;
    else if (magic == 20240522)
      bad(path, "this is an llm.c eval file (magic 20240522), not a token file");
    else
      bad(path, fmt::format("magic {} version {} is not an llm.c token file (20240520 v1 uint16, or 20240801 v7 uint32)", magic, version));
    if (ntok <= 0) bad(path, fmt::format("the header says {} tokens", ntok));
    const size_t want = 1024 + static_cast<size_t>(ntok) * static_cast<size_t>(width_);
    if (map_.size() != want)
      bad(path, fmt::format("is {} bytes but its header's {} tokens need {} (truncated or padded?)", map_.size(), ntok, want));
    size_ = ntok;
  }
  int64_t at(int64_t i) const override {
    const uint8_t* p = map_.bytes() + 1024;
    return width_ == 2 ? static_cast<int64_t>(read_le<uint16_t>(p + 2 * i)) : static_cast<int64_t>(read_le<uint32_t>(p + 4 * i));
  }

 private:
  Mapping map_;
  int width_ = 2;
};

class MegatronFile final : public TokenFile {
 public:
  MegatronFile(const std::string& idx_path, const std::string& bin_path) : idx_(idx_path), bin_(bin_path) {
    path_ = bin_path;
    const uint8_t* p = idx_.bytes();
    const size_t n = idx_.size();
    if (n < 34 || std::memcmp(p, "MMIDIDX\0\0", 9) != 0) bad(idx_path, "not a Megatron index (the magic MMIDIDX is missing)");
    if (read_le<uint64_t>(p + 9) != 1) bad(idx_path, fmt::format("index version {} is not 1", read_le<uint64_t>(p + 9)));
    code_ = p[17];
    if (itemsize(code_) == 0) bad(idx_path, fmt::format("dtype code {} is not one of 1-8", code_));
    const uint64_t seqs = read_le<uint64_t>(p + 18), docs = read_le<uint64_t>(p + 26);
    if (seqs > (1ull << 40) || docs > (1ull << 40) || 34 + 12 * seqs + 8 * docs > n)
      bad(idx_path, fmt::format("{} sequences and {} document entries do not fit in its {} bytes (truncated?)", seqs, docs, n));
    const uint8_t* lengths = p + 34;
    const uint8_t* pointers = lengths + 4 * seqs;
    const uint8_t* doc_index = pointers + 8 * seqs;
    if (docs == 0 || read_le<int64_t>(doc_index) != 0 || static_cast<uint64_t>(read_le<int64_t>(doc_index + 8 * (docs - 1))) != seqs)
      bad(idx_path, "its document index does not start at 0 and end at the sequence count");
    // Sequences back to back in .bin: the stream is their concatenation; document starts are
    // where each document's first sequence begins.
    starts_.reserve(seqs + 1);
    int64_t tokens = 0;
    const int64_t item = itemsize(code_);
    for (uint64_t s = 0; s < seqs; ++s) {
      const int32_t len = read_le<int32_t>(lengths + 4 * s);
      const int64_t ptr = read_le<int64_t>(pointers + 8 * s);
      if (len < 0 || ptr < 0 || ptr % item != 0 || static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * item > bin_.size())
        bad(idx_path, fmt::format("sequence {} (pointer {}, {} tokens) lies outside the {}-byte {}", s, ptr, len, bin_.size(), bin_path));
      seq_offsets_.push_back(ptr / item);
      starts_.push_back(tokens);
      tokens += len;
    }
    starts_.push_back(tokens);
    for (uint64_t d = 0; d + 1 < docs; ++d) {
      const int64_t first = read_le<int64_t>(doc_index + 8 * d), next = read_le<int64_t>(doc_index + 8 * (d + 1));
      if (next < first) bad(idx_path, fmt::format("its document index decreases at entry {}", d + 1));
      if (first < 0 || static_cast<uint64_t>(next) > seqs)  // checked before starts_[first] is read
        bad(idx_path, fmt::format("its document index entry {} ({}) is outside the {} sequences",
                                  next > static_cast<int64_t>(seqs) ? d + 1 : d, next > static_cast<int64_t>(seqs) ? next : first, seqs));
      document_starts_.push_back(starts_[static_cast<size_t>(first)]);
    }
    size_ = tokens;
  }
  int64_t at(int64_t i) const override {
    // The sequence holding stream position i, then its token.
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), i) - 1;
    const size_t s = static_cast<size_t>(it - starts_.begin());
    return element(bin_.bytes(), code_, seq_offsets_[s] + (i - *it));
  }

 private:
  Mapping idx_, bin_;
  int code_ = 0;
  std::vector<int64_t> starts_;       // stream offset of each sequence (+ the end)
  std::vector<int64_t> seq_offsets_;  // element offset of each sequence in .bin
};

std::string strip(const std::string& path, const std::string& suffix) {
  return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0
             ? path.substr(0, path.size() - suffix.size())
             : path;
}

void append_le(std::string& out, const void* v, size_t n) { out.append(static_cast<const char*>(v), n); }

}  // namespace

std::unique_ptr<TokenFile> open_token_file(const std::string& path, config::DataFormat format, int64_t seq_len) {
  std::unique_ptr<TokenFile> file;
  if (format == config::DataFormat::kMegatron) {
    const std::string prefix = strip(strip(path, ".bin"), ".idx");
    for (const char* ext : {".idx", ".bin"})
      if (!std::filesystem::is_regular_file(prefix + ext))
        bad(prefix + ext, "does not exist (a Megatron dataset is PREFIX.idx + PREFIX.bin)");
    verify_dataset_set(prefix);
    file = std::make_unique<MegatronFile>(prefix + ".idx", prefix + ".bin");
  } else {
    if (!std::filesystem::is_regular_file(path)) bad(path, "does not exist or is not a file");
    if (format == config::DataFormat::kBytes)
      file = std::make_unique<BytesFile>(path);
    else if (format == config::DataFormat::kLlmc)
      file = std::make_unique<LlmcFile>(path);
    else if (format == config::DataFormat::kRawU16)
      file = std::make_unique<RawU16File>(path);
    else
      throw Error(ErrorCode::kData, fmt::format("data format '{}' is not supported", config::name(format)),
                  "use bytes, megatron, llmc or raw_u16");
  }
  if (file->size() < seq_len + 1)
    throw Error(
        ErrorCode::kData,
        fmt::format("data file '{}' has {} tokens, fewer than one sample of seq_len + 1 = {}", file->path(), file->size(), seq_len + 1),
        "use a larger file or a smaller data.seq_len");
  return file;
}

void write_megatron(const std::string& prefix, const std::vector<std::vector<int64_t>>& documents, int code) {
  if (code == 0) {
    int64_t top = 0;
    for (const auto& d : documents)
      for (int64_t t : d) top = std::max(top, t);
    code = top < 65500 ? 8 : 4;  // Megatron's DType.optimal_dtype
  }
  const int item = itemsize(code);
  std::string bin, idx("MMIDIDX\0\0", 9);
  const uint64_t version = 1, seqs = documents.size(), docs = documents.size() + 1;
  append_le(idx, &version, 8);
  idx += static_cast<char>(code);
  append_le(idx, &seqs, 8);
  append_le(idx, &docs, 8);
  for (const auto& d : documents) {
    const int32_t len = static_cast<int32_t>(d.size());
    append_le(idx, &len, 4);
  }
  int64_t pointer = 0;
  for (const auto& d : documents) {
    append_le(idx, &pointer, 8);
    pointer += static_cast<int64_t>(d.size()) * item;
  }
  for (uint64_t i = 0; i < docs; ++i) {
    const int64_t v = static_cast<int64_t>(i);
    append_le(idx, &v, 8);
  }
  for (const auto& d : documents)
    for (int64_t t : d) {
      switch (code) {
        case 1: {
          const uint8_t v = static_cast<uint8_t>(t);
          append_le(bin, &v, 1);
          break;
        }
        case 2: {
          const int8_t v = static_cast<int8_t>(t);
          append_le(bin, &v, 1);
          break;
        }
        case 3: {
          const int16_t v = static_cast<int16_t>(t);
          append_le(bin, &v, 2);
          break;
        }
        case 4: {
          const int32_t v = static_cast<int32_t>(t);
          append_le(bin, &v, 4);
          break;
        }
        case 5:
          append_le(bin, &t, 8);
          break;
        case 6: {
          const double v = static_cast<double>(t);
          append_le(bin, &v, 8);
          break;
        }
        case 7: {
          const float v = static_cast<float>(t);
          append_le(bin, &v, 4);
          break;
        }
        default: {
          const uint16_t v = static_cast<uint16_t>(t);
          append_le(bin, &v, 2);
          break;
        }
      }
    }
  write_file_atomic(prefix + ".bin", bin);
  write_file_atomic(prefix + ".idx", idx);
}

void write_llmc(const std::string& path, const std::vector<int64_t>& tokens, int version) {
  std::string out(1024, '\0');
  const int32_t header[3] = {version == 7 ? 20240801 : 20240520, version, static_cast<int32_t>(tokens.size())};
  std::memcpy(out.data(), header, sizeof(header));
  for (int64_t t : tokens) {
    if (version == 7) {
      const uint32_t v = static_cast<uint32_t>(t);
      append_le(out, &v, 4);
    } else {
      const uint16_t v = static_cast<uint16_t>(t);
      append_le(out, &v, 2);
    }
  }
  write_file_atomic(path, out);
}

}  // namespace dstrain::data
