#include "dstrain/data/loss_mask.h"

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

constexpr char kMagic[8] = {'D', 'S', 'T', 'R', 'M', 'A', 'S', 'K'};

[[noreturn]] void write_failed(const std::string& path) {
  throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}': {}", path, std::strerror(errno)), "check free disk space");
}

}  // namespace

LossMaskWriter::LossMaskWriter(std::string prefix) : prefix_(std::move(prefix)), tmp_(prefix_ + ".lossmask.tmp") {
  if (const auto parent = fs::path(prefix_).parent_path(); !parent.empty()) fs::create_directories(parent);
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_) write_failed(tmp_);
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  char header[kLossMaskHeaderBytes];
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &kLossMaskVersion, 8);  // little-endian on every machine dstrain builds for
  if (std::fwrite(header, 1, sizeof header, file_) != sizeof header) write_failed(tmp_);
  crc_ = dstrain::crc32c(header, sizeof header);
}

LossMaskWriter::~LossMaskWriter() {
  if (file_) std::fclose(file_);
  if (!published_) {
    std::error_code ignored;
    fs::remove(tmp_, ignored);
  }
}

void LossMaskWriter::add(const uint8_t* mask, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (mask[i] > 1)
      throw Error(ErrorCode::kInternal, fmt::format("loss mask value {} (only 0 and 1)", mask[i]), "a dstrain bug: report it");
    trained_ += mask[i];
  }
  if (count > 0 && std::fwrite(mask, 1, count, file_) != count) write_failed(tmp_);
  crc_ = dstrain::crc32c(mask, count, crc_);
  tokens_ += static_cast<int64_t>(count);
}

void LossMaskWriter::stage() {
  if (staged_) return;
  if (std::fflush(file_) != 0 || std::ferror(file_)) write_failed(tmp_);
  std::fclose(file_);
  file_ = nullptr;
  fsync_path(tmp_);
  staged_ = true;
}

void LossMaskWriter::publish() {
  if (!staged_) throw Error(ErrorCode::kInternal, "LossMaskWriter::publish before stage", "a dstrain bug: report it");
  rename_atomic(tmp_, path());
  published_ = true;
}

LossMask::LossMask(const std::string& prefix, int64_t tokens) : path_(prefix + ".lossmask"), map_(path_), tokens_(tokens) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kData, fmt::format("loss mask '{}': {}", path_, what),
                 "prepare the dataset again with `dstrain prepare-data --chat` (it writes PREFIX.bin, .idx, .lossmask and .json together)");
  };
  if (map_.size() < kLossMaskHeaderBytes || std::memcmp(map_.bytes(), kMagic, 8) != 0)
    throw bad("not a dstrain loss mask (no DSTRMASK header)");
  uint64_t version = 0;
  std::memcpy(&version, map_.bytes() + 8, 8);
  if (version != kLossMaskVersion)
    throw bad(fmt::format("format version {}; this dstrain reads version {}{}", version, kLossMaskVersion,
                          version > kLossMaskVersion ? " (it was written by a newer dstrain)" : ""));
  const auto have = static_cast<int64_t>(map_.size() - kLossMaskHeaderBytes);
  if (have != tokens)
    throw bad(fmt::format("{} mask bytes for the {} tokens of {}.bin: the two were not written together", have, tokens, prefix));
}

bool has_loss_mask(const std::string& prefix) { return fs::is_regular_file(prefix + ".lossmask"); }

}  // namespace dstrain::data
