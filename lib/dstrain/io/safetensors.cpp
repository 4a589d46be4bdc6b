#include "dstrain/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"

namespace dstrain::io {
namespace {

constexpr uint64_t kMaxHeader = 100000000;  // the reference reader's MAX_HEADER_SIZE

// A damaged header's bytes (names, the JSON parser's "last read") shown as \xNN, not written raw
// to the terminal.
std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kCheckpoint, fmt::format("safetensors file '{}': {}", path, printable(what)),
              "the file is corrupt, truncated or not safetensors; re-export or re-download it");
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += static_cast<char>(c);
    else if (c < 0x20)
      out += fmt::format("\\u{:04x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

}  // namespace

int dtype_bits(const std::string& d) {
  static const std::map<std::string, int> bits = {
      {"F4", 4},      {"F6_E2M3", 6},     {"F6_E3M2", 6},     {"BOOL", 8}, {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16},   {"I32", 32},
      {"U32", 32},    {"F32", 32},        {"C64", 64},        {"F64", 64}, {"I64", 64}, {"U64", 64}};
  const auto it = bits.find(d);
  return it == bits.end() ? 0 : it->second;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kCheckpoint, fmt::format("cannot open '{}': {}", path, std::strerror(errno)), "check the path");
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad(path, fmt::format("cannot map it: {}", std::strerror(errno)));
  }
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    if (size_ < 8) bad(path, fmt::format("{} bytes is too small for the 8-byte header length", size_));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
    if (n > kMaxHeader) bad(path, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeader));
    if (8 + n > size_) bad(path, fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", n, size_));
    const std::string header(reinterpret_cast<const char*>(bytes + 8), n);

    // Parse, rejecting duplicate keys at any level (nlohmann would keep the last one silently).
    std::vector<std::set<std::string>> seen;
    std::string duplicate;
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(header, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::object_start) seen.resize(static_cast<size_t>(depth) + 1), seen[depth].clear();
        if (event == nlohmann::json::parse_event_t::key && depth > 0 && !seen[depth - 1].insert(parsed.get<std::string>()).second)
          duplicate = parsed.get<std::string>();
        return true;
      });
    } catch (const nlohmann::json::exception& e) {
      bad(path, fmt::format("the header is not valid JSON: {}", e.what()));
    }
    if (!duplicate.empty()) bad(path, fmt::format("the header names '{}' twice", duplicate));
    if (!doc.is_object()) bad(path, "the header is not a JSON object");
    const uint64_t buffer = size_ - 8 - n;
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) bad(path, "__metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) bad(path, fmt::format("__metadata__ value of '{}' is not a string", m.key()));
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const auto& t = *it;
      if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") || !t["dtype"].is_string() ||
          !t["shape"].is_array() || !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
        bad(path, fmt::format("tensor '{}' lacks a string dtype, a shape list or two data_offsets", it.key()));
      TensorInfo info;
      info.name = it.key();
      info.dtype = t["dtype"].get<std::string>();
      const int bits = dtype_bits(info.dtype);
      if (bits == 0) bad(path, fmt::format("tensor '{}' has unknown dtype '{}'", info.name, info.dtype));
      uint64_t numel = 1;
      for (const auto& d : t["shape"]) {
        if (!d.is_number_unsigned()) bad(path, fmt::format("tensor '{}' has a shape entry that is not a non-negative integer", info.name));
        info.shape.push_back(d.get<int64_t>());
        if (mul_overflows(numel, d.get<uint64_t>(), numel)) bad(path, fmt::format("tensor '{}': the shape overflows", info.name));
      }
      for (const auto& o : t["data_offsets"])
        if (!o.is_number_unsigned()) bad(path, fmt::format("tensor '{}' has a data offset that is not a non-negative integer", info.name));
      info.begin = t["data_offsets"][0].get<uint64_t>();
      info.end = t["data_offsets"][1].get<uint64_t>();
      uint64_t total_bits = 0;
      if (mul_overflows(numel, static_cast<uint64_t>(bits), total_bits))
        bad(path, fmt::format("tensor '{}': the size overflows", info.name));
      if (total_bits % 8 != 0) bad(path, fmt::format("tensor '{}' is not a whole number of bytes", info.name));
      if (info.end < info.begin || info.end - info.begin != total_bits / 8)
        bad(path, fmt::format("tensor '{}' has offsets [{}, {}] but its shape and dtype need {} bytes", info.name, info.begin, info.end,
                              total_bits / 8));
      tensors_.push_back(info);
    }
    std::sort(tensors_.begin(), tensors_.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    uint64_t expected = 0;
    for (auto& t : tensors_) {
      if (t.begin != expected)
        bad(path, fmt::format("tensor '{}' starts at {} but the previous one ends at {} ({})", t.name, t.begin, expected,
                              t.begin < expected ? "overlapping data" : "a gap"));
      expected = t.end;
      t.data = bytes + 8 + n + t.begin;
    }
    if (expected != buffer)
      bad(path, fmt::format("the tensors cover {} bytes but the data buffer has {} ({})", expected, buffer,
                            expected > buffer ? "offsets out of range: truncated?" : "trailing bytes"));
  } catch (...) {
    if (map_) ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t SafetensorsWriter::Entry::nbytes() const {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  return numel * static_cast<uint64_t>(dtype_bits(dtype)) / 8;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Entry> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : order_(std::move(tensors)) {
  std::set<std::string> names;
  for (const auto& t : order_) {
    if (dtype_bits(t.dtype) == 0)
      throw Error(ErrorCode::kInternal, fmt::format("safetensors writer: unknown dtype '{}' for '{}'", t.dtype, t.name), "");
    if (!names.insert(t.name).second || t.name == "__metadata__")
      throw Error(ErrorCode::kInternal, fmt::format("safetensors writer: duplicate or reserved tensor name '{}'", t.name), "");
  }
  std::stable_sort(order_.begin(), order_.end(), [](const Entry& a, const Entry& b) {
    const int ba = dtype_bits(a.dtype), bb = dtype_bits(b.dtype);
    return ba != bb ? ba > bb : a.name < b.name;
  });
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata)
      header += fmt::format("{}\"{}\":\"{}\"", first ? "" : ",", json_escape(k), json_escape(v)), first = false;
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& t : order_) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    header += fmt::format("\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json_escape(t.name), t.dtype, shape,
                          offset, offset + t.nbytes());
    offset += t.nbytes();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxHeader) throw Error(ErrorCode::kInternal, "safetensors writer: the header exceeds 100,000,000 bytes", "");
  char length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  file_ = std::make_unique<AtomicFileWriter>(path);
  file_->write(length, sizeof length);
  file_->write(header.data(), header.size());
  file_bytes_ = 8 + header.size() + offset;
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const std::string& name, const void* data, uint64_t nbytes) {
  if (next_ >= order_.size() || order_[next_].name != name)
    throw Error(
        ErrorCode::kInternal,
        fmt::format("safetensors writer: '{}' out of order (expected '{}')", name, next_ < order_.size() ? order_[next_].name : "nothing"),
        "");
  if (nbytes != order_[next_].nbytes())
    throw Error(ErrorCode::kInternal,
                fmt::format("safetensors writer: '{}' has {} bytes, its shape needs {}", name, nbytes, order_[next_].nbytes()), "");
  file_->write(data, nbytes);
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != order_.size())
    throw Error(ErrorCode::kInternal, fmt::format("safetensors writer: {} of {} tensors written", next_, order_.size()), "");
  file_->commit();
}

void write_safetensors(const std::string& path, std::vector<TensorToWrite> tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  std::map<std::string, const TensorToWrite*> by_name;
  for (const auto& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape});
    by_name[t.name] = &t;
    if (dtype_bits(t.dtype) != 0 && entries.back().nbytes() != t.nbytes)
      throw Error(ErrorCode::kInternal,
                  fmt::format("safetensors writer: '{}' has {} bytes, its shape needs {}", t.name, t.nbytes, entries.back().nbytes()), "");
  }
  SafetensorsWriter writer(path, std::move(entries), metadata);
  for (const auto& e : writer.order()) writer.write(e.name, by_name.at(e.name)->data, by_name.at(e.name)->nbytes);
  writer.finish();
}

}  // namespace dstrain::io
