#include "dstrain/data/megatron_writer.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"

namespace dstrain::data {
namespace fs = std::filesystem;

namespace {
void append(std::string& out, const void* v, size_t n) { out.append(static_cast<const char*>(v), n); }
}  // namespace

MegatronStreamWriter::MegatronStreamWriter(std::string prefix, int dtype_code)
    : prefix_(std::move(prefix)), tmp_(prefix_ + ".bin.tmp"), dtype_code_(dtype_code) {
  if (const auto parent = fs::path(prefix_).parent_path(); !parent.empty()) fs::create_directories(parent);
  bin_ = std::fopen(tmp_.c_str(), "wb");
  if (!bin_)
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}': {}", tmp_, std::strerror(errno)), "check the output directory");
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

MegatronStreamWriter::~MegatronStreamWriter() {
  if (bin_) std::fclose(bin_);
  if (!published_) {
    std::error_code ignored;
    fs::remove(tmp_, ignored);
    fs::remove(prefix_ + ".idx.tmp", ignored);
  }
}

void MegatronStreamWriter::add_document(const uint32_t* tokens, size_t count, const std::string& origin) {
  if (count > 0x7fffffff)
    throw Error(ErrorCode::kData, fmt::format("{}: {} tokens in one document; Megatron's index holds at most 2^31-1", origin, count),
                "split the file into smaller documents (e.g. JSON Lines)");
  const size_t width = dtype_code_ == 8 ? 2 : 4;
  staging_.resize(count * width);
  for (size_t i = 0; i < count; ++i) {
    if (width == 2) {
      const auto v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(staging_.data() + i * 2, &v, 2);
    } else {
      const auto v = static_cast<int32_t>(tokens[i]);
      std::memcpy(staging_.data() + i * 4, &v, 4);
    }
  }
  if (std::fwrite(staging_.data(), 1, staging_.size(), bin_) != staging_.size())
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}': {}", tmp_, std::strerror(errno)), "check free disk space");
  bin_crc_ = crc32c(staging_.data(), staging_.size(), bin_crc_);
  lengths_.push_back(static_cast<int32_t>(count));
  tokens_ += static_cast<int64_t>(count);
}

void MegatronStreamWriter::stage() {
  if (staged_) return;
  if (std::fflush(bin_) != 0 || std::ferror(bin_))
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}': {}", tmp_, std::strerror(errno)), "check free disk space");
  std::fclose(bin_);
  bin_ = nullptr;
  fsync_path(tmp_);
  std::string idx("MMIDIDX\0\0", 9);
  const uint64_t version = 1, seqs = lengths_.size(), docs = lengths_.size() + 1;
  append(idx, &version, 8);
  idx += static_cast<char>(dtype_code_);
  append(idx, &seqs, 8);
  append(idx, &docs, 8);
  append(idx, lengths_.data(), lengths_.size() * 4);
  const int64_t width = dtype_code_ == 8 ? 2 : 4;
  int64_t pointer = 0;
  for (int32_t len : lengths_) append(idx, &pointer, 8), pointer += int64_t{len} * width;
  for (uint64_t i = 0; i < docs; ++i) {
    const int64_t v = static_cast<int64_t>(i);
    append(idx, &v, 8);
  }
  idx_crc_ = crc32c(idx.data(), idx.size());
  write_file_atomic(prefix_ + ".idx.tmp", idx);
  staged_ = true;
}

void MegatronStreamWriter::publish() {
  if (!staged_) throw Error(ErrorCode::kInternal, "MegatronStreamWriter::publish before stage", "a dstrain bug: report it");
  rename_atomic(tmp_, prefix_ + ".bin");
  rename_atomic(prefix_ + ".idx.tmp", prefix_ + ".idx");
  published_ = true;
}

}  // namespace dstrain::data
