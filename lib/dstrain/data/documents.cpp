#include "dstrain/data/documents.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/data/parquet_rows.h"

namespace dstrain::data {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool wanted(const fs::path& p, const std::vector<std::string>& extensions) {
  if (extensions.empty()) return true;
  const std::string name = p.filename().string();
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) { return ends_with(name, e); });
}

bool looks_jsonl(const std::string& path) {
  std::string name = path;
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  return ends_with(name, ".jsonl") || ends_with(name, ".ndjson");
}

constexpr size_t kChunk = 1 << 20;

}  // namespace

std::vector<DocumentSource> list_sources(const std::vector<std::string>& inputs, const std::vector<std::string>& extensions,
                                         InputFormat format) {
  std::vector<DocumentSource> out;
  const auto add = [&](const std::string& path) {
    const bool parquet = format != InputFormat::kText && ends_with(path, ".parquet");
    const bool jsonl = parquet || format == InputFormat::kJsonl || (format == InputFormat::kAuto && looks_jsonl(path));
    out.push_back({path, jsonl, parquet});
  };
  for (const auto& input : inputs) {
    if (input == "-") {
      add("-");
    } else if (fs::is_regular_file(input)) {
      add(input);
    } else if (fs::is_directory(input)) {
      std::vector<std::string> files;
      for (const auto& e : fs::recursive_directory_iterator(input, fs::directory_options::skip_permission_denied))
        if (e.is_regular_file() && wanted(e.path(), extensions)) files.push_back(e.path().string());
      std::sort(files.begin(), files.end());  // the same dataset from the same inputs, on every machine
      for (const auto& f : files) add(f);
    } else {
      throw Error(ErrorCode::kData, fmt::format("input '{}' does not exist", input),
                  "pass text or JSON Lines files, folders, or - for stdin");
    }
  }
  if (out.empty()) throw Error(ErrorCode::kData, "no input files matched", "check the paths and --ext");
  return out;
}

RecordReader::RecordReader(std::vector<DocumentSource> sources, int64_t max_record_bytes)
    : sources_(std::move(sources)), max_record_bytes_(max_record_bytes) {}

namespace {
[[noreturn]] void too_long(const std::string& path, uint64_t line, int64_t limit) {
  throw Error(ErrorCode::kData,
              fmt::format("{}{}: the record is longer than {} MiB (after decompression){}", path == "-" ? "stdin" : path,
                          line > 0 ? fmt::format(":{}", line) : std::string(), limit >> 20,
                          line > 0 ? ": a line that never ends, or not JSON Lines" : ""),
              "raise --max-line-bytes if the data really holds such documents, or split them");
}
}  // namespace

RecordReader::~RecordReader() {
  if (file_) gzclose(static_cast<gzFile>(file_));
}

bool RecordReader::next_row(Record& record) {
  if (!parquet_) parquet_ = std::make_unique<ParquetRows>(sources_[current_].path), line_ = 0;
  if (!parquet_->next(record.payload)) {
    parquet_.reset();
    ++current_;
    return false;
  }
  bytes_read_ += static_cast<int64_t>(record.payload.size());
  record.source = static_cast<uint32_t>(current_), record.line = ++line_;
  return true;
}

bool RecordReader::open_next() {
  if (file_) gzclose(static_cast<gzFile>(file_)), file_ = nullptr;
  while (current_ < sources_.size()) {
    const auto& source = sources_[current_];
    // gzread passes uncompressed input through as it is, so every file goes through zlib.
    const int fd = source.path == "-" ? ::dup(STDIN_FILENO) : ::open(source.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) file_ = gzdopen(fd, "rb");
    if (file_) {
      gzbuffer(static_cast<gzFile>(file_), 1 << 17);
      buffer_.clear(), begin_ = 0, eof_ = false, line_ = 0;
      return true;
    }
    if (fd >= 0) ::close(fd);
    if (source.path == "-") throw Error(ErrorCode::kData, "cannot read stdin", "");
    ++current_;  // unreadable files are skipped, as folders of sources often hold some
  }
  return false;
}

bool RecordReader::read_more() {
  if (eof_) return false;
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunk);
  const int n = gzread(static_cast<gzFile>(file_), buffer_.data() + old, static_cast<unsigned>(kChunk));
  if (n < 0) {
    int code = 0;
    const char* message = gzerror(static_cast<gzFile>(file_), &code);
    throw Error(ErrorCode::kData,
                fmt::format("cannot read '{}': {}", sources_[current_].path, code == Z_ERRNO ? std::strerror(errno) : message),
                "a truncated or corrupt .gz file? check it with gzip -t");
  }
  buffer_.resize(old + static_cast<size_t>(n));
  bytes_read_ += n;
  if (n == 0) eof_ = true;
  return n > 0;
}

bool RecordReader::next(Record& record) {
  for (;;) {
    if (current_ < sources_.size() && sources_[current_].parquet) {
      if (next_row(record)) return true;
      continue;
    }
    if (!file_) {
      if (current_ >= sources_.size() || !open_next()) return false;
    }
    const auto& source = sources_[current_];
    if (!source.jsonl) {  // the whole file is one document
      // A plain file is bounded by its size; a compressed one or stdin only by the record bound.
      const bool unbounded = source.path == "-" || gzdirect(static_cast<gzFile>(file_)) == 0;
      while (read_more())
        if (unbounded && static_cast<int64_t>(buffer_.size()) > max_record_bytes_) too_long(source.path, 0, max_record_bytes_);
      record.payload.swap(buffer_);
      record.source = static_cast<uint32_t>(current_), record.line = 0;
      buffer_.clear();
      ++current_, gzclose(static_cast<gzFile>(file_)), file_ = nullptr;
      return true;
    }
    for (;;) {
      const size_t newline = buffer_.find('\n', begin_);
      if (newline != std::string::npos || (eof_ && begin_ < buffer_.size())) {
        const size_t end = newline == std::string::npos ? buffer_.size() : newline;
        record.payload.assign(buffer_, begin_, end - begin_);
        record.source = static_cast<uint32_t>(current_), record.line = ++line_;
        begin_ = end + 1;
        return true;
      }
      if (eof_) break;
      buffer_.erase(0, begin_), begin_ = 0;
      if (static_cast<int64_t>(buffer_.size()) > max_record_bytes_) too_long(source.path, line_ + 1, max_record_bytes_);
      read_more();
    }
    ++current_, gzclose(static_cast<gzFile>(file_)), file_ = nullptr;
  }
}

std::vector<std::string> json_line_texts(const Record& record, const std::vector<std::string>& keys, const std::string& source_path) {
  const auto where = [&] { return fmt::format("{}:{}", source_path == "-" ? "stdin" : source_path, record.line); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(record.payload);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kData, fmt::format("{}: not a JSON line: {}", where(), e.what()),
                "each line must be one JSON object; pass --input-format text to read the file as plain text");
  }
  if (!j.is_object())
    throw Error(ErrorCode::kData, fmt::format("{}: the line is JSON but not an object", where()), "each line must be {\"text\": ...}");
  std::vector<std::string> out;
  for (const auto& key : keys) {
    const auto it = j.find(key);
    if (it == j.end()) {
      std::string present;
      for (const auto& [k, v] : j.items()) present += (present.empty() ? "" : ", ") + k;
      throw Error(ErrorCode::kData, fmt::format("{}: no key '{}' (the line has: {})", where(), key, present.empty() ? "nothing" : present),
                  "choose the text's key with --json-key");
    }
    if (!it->is_string())
      throw Error(ErrorCode::kData, fmt::format("{}: '{}' is a {}, not a string", where(), key, it->type_name()),
                  "choose the text's key with --json-key");
    out.push_back(it->get<std::string>());
  }
  return out;
}

}  // namespace dstrain::data
