#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"

namespace dstrain::ckpt {
namespace fs = std::filesystem;
using namespace detail;

namespace {

// An integer field, read exactly. nlohmann turns a float (1e30, or a 40-digit literal it parsed as
// one) into an integer with a cast whose overflow is undefined behaviour (found by
// manifest_fuzz): anything but an integer in T's range is a type error, as a string would be.
template <typename T>
T integer(const nlohmann::json& j) {
  bool fits = false;
  if (j.is_number_unsigned())
    fits = j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  else if (j.is_number_integer())
    fits = std::numeric_limits<T>::is_signed && j.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min());
  if (!fits)
    throw nlohmann::json::type_error::create(302, "expected an integer that fits in " + std::to_string(sizeof(T) * 8) + " bits", &j);
  return j.get<T>();
}

std::vector<int64_t> integers(const nlohmann::json& j) {
  if (!j.is_array()) throw nlohmann::json::type_error::create(302, "expected a list of integers", &j);
  std::vector<int64_t> out;
  for (const auto& v : j) out.push_back(integer<int64_t>(v));
  return out;
}

// The manifest, parsed; `text` (optional) receives its bytes, for the COMMITTED checksum.
nlohmann::json read_manifest(const std::string& dir, std::string* text = nullptr) {
  const std::string path = (fs::path(dir) / kManifest).string();
  if (!fs::is_regular_file(path)) corrupt(dir, "manifest.json is missing");
  nlohmann::json m;
  try {
    const std::string bytes = read_file(path);
    if (text) *text = bytes;
    m = nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, fmt::format("not valid JSON ({})", e.what()));
  }
  // Typed access only after the type is checked: a number where a string belongs is a corrupt
  // manifest, not a json::type_error escaping the fallback (found by manifest_fuzz).
  const auto format = m.is_object() ? m.find("format") : m.end();
  if (format == m.end() || !format->is_string() || format->get<std::string>() != kFormatName)
    corrupt(path, "not a dstrain checkpoint manifest");
  const auto version_entry = m.find("format_version");
  const int version = version_entry != m.end() && version_entry->is_number_integer() ? version_entry->get<int>() : 0;
  if (version < kOldestReadableVersion || version > kFormatVersion)
    corrupt(path, fmt::format("format_version {} is not supported (this dstrain reads versions {} to {}){}", version,
                              kOldestReadableVersion, kFormatVersion,
                              version == 1 ? "; version 1 came before sharded checkpoints: export it with the dstrain that wrote it"
                              : version > kFormatVersion ? "; it was written by a newer dstrain"
                                                         : ""));
  return m;
}

// The shard table (format 3), checked so that no hostile value can overflow the arithmetic or
// make a rank's file claim bytes it does not have.
ShardTable shard_table_from(const nlohmann::json& j, const std::string& manifest) {
  ShardTable t;
  t.ranks = integer<int64_t>(j.at("ranks"));
  if (t.ranks < 1 || t.ranks > (int64_t{1} << 24)) corrupt(manifest, fmt::format("shards: {} ranks is out of range", t.ranks));
  for (const auto& p : j.at("prefixes")) t.prefixes.push_back(p.get<std::string>());
  if (t.prefixes.empty() || t.prefixes.size() > 8 ||
      std::set<std::string>(t.prefixes.begin(), t.prefixes.end()).size() != t.prefixes.size())
    corrupt(manifest, "shards: the state prefixes must be 1 to 8 distinct names");
  for (const auto& ju : j.at("units")) {
    ShardTable::Unit u;
    u.chunk = integer<int64_t>(ju.at("chunk"));
    if (u.chunk < 1 || u.chunk > (int64_t{1} << 48) / t.ranks)
      corrupt(manifest, fmt::format("shards: a unit's chunk of {} is out of range", u.chunk));
    int64_t end = 0;
    for (const auto& jp : ju.at("params")) {
      ShardTable::Param p{jp.at(0).get<std::string>(), integer<int64_t>(jp.at(1)), integer<int64_t>(jp.at(2))};
      if (p.offset < end || p.numel < 0 || p.numel > u.chunk * t.ranks - p.offset)
        corrupt(manifest, fmt::format("shards: parameter {} lies outside its unit or overlaps another", p.name));
      end = p.offset + p.numel;
      u.params.push_back(std::move(p));
    }
    t.units.push_back(std::move(u));
  }
  return t;
}

TrainState state_from(const nlohmann::json& m, const std::string& manifest) {
  TrainState s;
  s.step = integer<int64_t>(m.at("step"));
  s.samples_consumed = integer<int64_t>(m.at("samples_consumed"));
  s.tokens_consumed = integer<int64_t>(m.at("tokens_consumed"));
  s.world_size = integer<int64_t>(m.at("world_size"));
  s.zero_stage = integer<int64_t>(m.at("zero_stage"));
  s.precision = m.at("precision").get<std::string>();
  s.config_hash = m.at("config_hash").get<std::string>();
  s.model = m.at("model").get<std::string>();
  s.created = m.at("created").get<std::string>();
  if (const auto base = m.find("base"); base != m.end()) {  // format 4
    s.base.path = base->at("path").get<std::string>();
    for (const auto& f : base->at("files"))
      s.base.files.push_back({f.at("name").get<std::string>(), integer<uint64_t>(f.at("bytes")), integer<uint32_t>(f.at("crc32c"))});
    if (s.base.path.empty() || s.base.files.empty()) corrupt(manifest, "base: an empty path or no files");
  }
  return s;
}

// The tensor's element count, refusing negative dimensions and counts no memory could hold.
int64_t checked_numel(const TensorMeta& t, const std::string& manifest) {
  int64_t n = 1;
  for (int64_t d : t.shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 48))
      corrupt(manifest, fmt::format("tensor {}: shape [{}] is negative or too large", t.name, fmt::join(t.shape, ", ")));
  return n;
}

// A regular file's size; a checkpoint error (never a filesystem exception) for anything else.
uint64_t regular_file_size(const std::string& path, const std::string& holds) {
  std::error_code ec;
  if (!fs::exists(path, ec)) corrupt(path, "is missing" + holds);
  if (!fs::is_regular_file(path, ec)) corrupt(path, "is not a regular file" + holds);
  const uint64_t size = fs::file_size(path, ec);
  if (ec) corrupt(path, "cannot be read: " + ec.message() + holds);
  return size;
}

// "a, b, c, d and 7 more": the tensors a damaged file held, for the message.
std::string name_list(const std::vector<std::string>& names) {
  const size_t shown = std::min<size_t>(names.size(), 4);
  std::string out = fmt::format("{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

uint32_t crc32c_of_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) corrupt(path, "cannot be opened");
  std::vector<char> buf(1 << 22);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      ::close(fd);
      corrupt(path, "cannot be read");
    }
    if (n == 0) break;
    crc = crc32c(buf.data(), static_cast<size_t>(n), crc);
  }
  ::close(fd);
  return crc;
}

struct FileEntry {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::set<std::string> tensors;  // for messages
};
using Extents = std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>>;  // per file: [offset, end) of each piece

// `bytes` from `path` at `offset` into out; a checkpoint error on a short file.
void pread_exact(const std::string& path, uint64_t offset, char* out, size_t bytes, const std::string& tensor) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) corrupt(path, "cannot be opened");
  off_t at = static_cast<off_t>(offset);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, at);
    if (n <= 0) {
      ::close(fd);
      corrupt(path, fmt::format("cannot read tensor {} (short file)", tensor));
    }
    out += n, bytes -= static_cast<size_t>(n), at += n;
  }
  ::close(fd);
}

int64_t overlap(const ShardTable::Param& p, int64_t lo, int64_t hi) {
  return std::max<int64_t>(0, std::min(hi, p.offset + p.numel) - std::max(lo, p.offset));
}

}  // namespace

struct Reader::Impl {
  std::map<std::string, FileEntry> files;
  std::map<std::string, std::vector<std::pair<std::string, Piece>>> pieces;  // tensor -> (file, piece), by start
  // Format 3: the engine's sharded tensors, placed by the table (state prefix, unit, parameter).
  std::optional<ShardTable> table;
  struct Sharded {
    size_t state = 0, unit = 0, param = 0;
  };
  std::map<std::string, Sharded> sharded;
  mutable std::map<int64_t, std::vector<int64_t>> unit_starts;  // by rank, computed when first read (under mu)

  std::vector<int64_t> unit_starts_of(int64_t rank) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = unit_starts.find(rank);
    if (it == unit_starts.end()) it = unit_starts.emplace(rank, table->rank_unit_starts(rank)).first;
    return it->second;
  }

  // Checks the table against the tensors marked "shards" and the files, and adds each rank's
  // shard bytes to its file's extents.
  void place_shards(ShardTable t, const std::map<std::string, const TensorMeta*>& marked, Extents& extents, const std::string& manifest) {
    for (size_t s = 0; s < t.prefixes.size(); ++s)
      for (size_t u = 0; u < t.units.size(); ++u)
        for (size_t i = 0; i < t.units[u].params.size(); ++i) {
          const std::string name = t.prefixes[s] + t.units[u].params[i].name;
          const auto it = marked.find(name);
          if (it == marked.end() || it->second->dtype != "float32" || it->second->numel() != t.units[u].params[i].numel)
            corrupt(manifest,
                    fmt::format("shards: {} is not a float32 tensor of {} elements marked \"shards\"", name, t.units[u].params[i].numel));
          if (!sharded.emplace(name, Sharded{s, u, i}).second) corrupt(manifest, fmt::format("shards: {} is placed twice", name));
        }
    if (sharded.size() != marked.size()) corrupt(manifest, "shards: a tensor marked \"shards\" is not in the shard table");
    for (int64_t r = 0; r < t.ranks; ++r) {
      const std::string file = shard_file_name(r);
      const auto fit = files.find(file);
      const uint64_t bytes = static_cast<uint64_t>(t.rank_elements(r)) * t.prefixes.size() * 4;
      if (fit == files.end() || bytes > fit->second.bytes)
        corrupt(manifest, fmt::format("shards: {} is not listed or is smaller than rank {}'s shards ({} bytes)", file, r, bytes));
      if (bytes > 0) extents[file].emplace_back(0, bytes);
      fit->second.tensors.insert(fmt::format("the ZeRO shards of rank {}", r));
    }
    table = std::move(t);
  }

  // Elements [start, start + count) of a sharded tensor, from the ranks' files that hold them.
  void read_shards(const std::string& dir, const std::string& name, const Sharded& s, int64_t start, int64_t count, char* out) const {
    const ShardTable::Unit& u = table->units[s.unit];
    const ShardTable::Param& p = u.params[s.param];
    for (int64_t pos = p.offset + start, end = pos + count; pos < end;) {
      const int64_t r = pos / u.chunk, lo = r * u.chunk, hi = std::min(end, lo + u.chunk);
      int64_t before = 0;  // the unit's earlier parameters' elements in chunk r
      for (size_t q = 0; q < s.param; ++q) before += overlap(u.params[q], lo, lo + u.chunk);
      const std::vector<int64_t> starts = unit_starts_of(r);
      const int64_t element = static_cast<int64_t>(s.state) * starts.back() + starts[s.unit] + before + (pos - std::max(lo, p.offset));
      const std::string file = shard_file_name(r);
      check_file(dir, file, !trust_crc);
      pread_exact((fs::path(dir) / file).string(), static_cast<uint64_t>(element) * 4, out, static_cast<size_t>(hi - pos) * 4, name);
      out += (hi - pos) * 4;
      pos = hi;
    }
  }
  mutable std::mutex mu;
  mutable std::set<std::string> verified;
  bool trust_crc = false;

  // `crc`: read the whole file for its checksum (verify() always does; reads unless trust_crc).
  void check_file(const std::string& dir, const std::string& name, bool crc) const {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (verified.count(name)) return;
    }
    const FileEntry& f = files.at(name);
    const std::string path = (fs::path(dir) / name).string();
    const std::string holds = " (it holds " + name_list(std::vector<std::string>(f.tensors.begin(), f.tensors.end())) + ")";
    const uint64_t size = regular_file_size(path, holds);
    if (size != f.bytes) corrupt(path, fmt::format("has {} bytes, the manifest says {}: truncated or overwritten{}", size, f.bytes, holds));
    if (crc && crc32c_of_file(path) != f.crc) corrupt(path, "checksum mismatch: the file is corrupt" + holds);
    std::lock_guard<std::mutex> lock(mu);
    verified.insert(name);
  }
};

Reader::Reader(const std::string& dir, bool verified) : dir_(dir), impl_(std::make_unique<Impl>()) {
  impl_->trust_crc = verified;
  if (!fs::is_regular_file(fs::path(dir) / kCommitted)) corrupt(dir, "has no COMMITTED marker (the save did not finish)");
  std::string manifest_text;
  const nlohmann::json m = read_manifest(dir, &manifest_text);
  const std::string manifest = (fs::path(dir) / kManifest).string();
  if (!committed_matches(read_file((fs::path(dir) / kCommitted).string()), crc32c(manifest_text.data(), manifest_text.size())))
    corrupt(manifest, "does not match the checksum recorded in COMMITTED: it was changed after the save");
  try {
    state_ = state_from(m, manifest);
    for (const auto& f : m.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      if (!is_plain_file_name(name)) corrupt(manifest, fmt::format("file name '{}' is not a plain file name in the checkpoint", name));
      if (!impl_->files.emplace(name, FileEntry{integer<uint64_t>(f.at("bytes")), integer<uint32_t>(f.at("crc32c")), {}}).second)
        corrupt(manifest, fmt::format("file {} is listed twice", name));
    }
    Extents extents;
    std::set<std::string> marked;  // placed by the shard table
    for (const auto& t : m.at("tensors")) {
      TensorMeta meta{t.at("name"), t.at("dtype"), integers(t.at("shape"))};
      const int64_t esize = dtype_size(meta.dtype);
      const int64_t numel = checked_numel(meta, manifest);
      if (impl_->pieces.count(meta.name)) corrupt(manifest, fmt::format("tensor {} is listed twice", meta.name));
      auto& list = impl_->pieces[meta.name];
      if (t.at("pieces").is_string()) {
        if (t.at("pieces").get<std::string>() != kShardPieces || !m.contains("shards"))
          corrupt(manifest, fmt::format("tensor {}: \"pieces\" must be a list, or \"shards\" with a shard table", meta.name));
        marked.insert(meta.name);
        tensors_.push_back(std::move(meta));
        continue;
      }
      for (const auto& p : t.at("pieces")) {
        const std::string file = p.at("file");
        const auto fit = impl_->files.find(file);
        if (fit == impl_->files.end())
          corrupt(manifest, fmt::format("tensor {} names file {}, which the manifest does not list", meta.name, file));
        Piece piece{meta.name, integer<int64_t>(p.at("start")), integer<int64_t>(p.at("count")), integer<uint64_t>(p.at("offset"))};
        uint64_t end = 0;
        if (piece.start < 0 || piece.count < 0 || piece.start > numel || piece.count > numel - piece.start ||
            __builtin_add_overflow(piece.offset, static_cast<uint64_t>(piece.count) * static_cast<uint64_t>(esize), &end) ||
            end > fit->second.bytes)
          corrupt(manifest, fmt::format("tensor {}: a piece lies outside the tensor or its file {}", meta.name, file));
        extents[file].emplace_back(piece.offset, end);
        fit->second.tensors.insert(meta.name);
        list.push_back({file, piece});
      }
      std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.second.start < b.second.start; });
      int64_t next = 0;
      for (const auto& [file, piece] : list) {
        if (piece.start != next) corrupt(manifest, fmt::format("tensor {}: elements from {} are in no piece", meta.name, next));
        next += piece.count;
      }
      if (next != numel) corrupt(manifest, fmt::format("tensor {}: elements from {} are in no piece", meta.name, next));
      tensors_.push_back(std::move(meta));
    }
    if (m.contains("shards")) {
      std::map<std::string, const TensorMeta*> by_table;
      for (const auto& t : tensors_)
        if (marked.count(t.name)) by_table[t.name] = &t;
      impl_->place_shards(shard_table_from(m.at("shards"), manifest), by_table, extents, manifest);
    }
    // The pieces tile each file exactly: no gap, no overlap, nothing past the end (a shifted
    // offset would otherwise load other bytes as weights).
    for (auto& [name, file] : impl_->files) {
      auto& spans = extents[name];
      std::sort(spans.begin(), spans.end());
      uint64_t at = 0;
      for (const auto& [begin, end] : spans) {
        if (begin != at)
          corrupt(manifest, fmt::format("file {}: bytes from {} are {} (pieces must tile it exactly)", name, std::min(at, begin),
                                        begin > at ? "in no piece" : "in two pieces"));
        at = end;
      }
      if (at != file.bytes) corrupt(manifest, fmt::format("file {}: bytes from {} of {} are in no piece", name, at, file.bytes));
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt(manifest, fmt::format("missing or mistyped entry ({})", e.what()));
  }
}

Reader::~Reader() = default;

const TensorMeta* Reader::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void Reader::read(const std::string& name, int64_t start, int64_t count, void* dst, const std::string& dtype) const {
  const TensorMeta* meta = find(name);
  if (!meta) corrupt(dir_, fmt::format("has no tensor '{}' (it was written for another model?)", name));
  if (meta->dtype != dtype) corrupt(dir_, fmt::format("tensor {} is {}, expected {}", name, meta->dtype, dtype));
  if (start < 0 || start + count > meta->numel())
    corrupt(dir_, fmt::format("tensor {}: elements [{}, {}) requested of {}", name, start, start + count, meta->numel()));
  if (const auto s = impl_->sharded.find(name); s != impl_->sharded.end())
    return impl_->read_shards(dir_, name, s->second, start, count, static_cast<char*>(dst));
  const int64_t esize = dtype_size(dtype);
  for (const auto& [file, p] : impl_->pieces.at(name)) {
    const int64_t a = std::max(start, p.start), b = std::min(start + count, p.start + p.count);
    if (a >= b) continue;
    impl_->check_file(dir_, file, !impl_->trust_crc);
    pread_exact((fs::path(dir_) / file).string(), p.offset + static_cast<uint64_t>((a - p.start) * esize),
                static_cast<char*>(dst) + (a - start) * esize, static_cast<size_t>((b - a) * esize), name);
  }
}

void Reader::verify() const { verify(0, 1); }

void Reader::verify(int part, int parts) const {
  int index = 0;
  for (const auto& [name, f] : impl_->files)  // by name: every rank sees the same order
    if (index++ % parts == part) impl_->check_file(dir_, name, true);
}

bool has_committed_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return false;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (fs::exists(e.path() / kCommitted, ec)) return true;
  return false;
}

namespace {
// The step directory that the one-line file `pointer` (latest, best) under `root` names.
std::optional<std::string> named_checkpoint(const std::string& root, const char* pointer) {
  const fs::path file = fs::path(root) / pointer;
  if (!fs::exists(file)) return std::nullopt;
  std::string name = read_file(file.string());
  name.erase(std::remove_if(name.begin(), name.end(), [](char c) { return c == '\n' || c == '\r' || c == ' '; }), name.end());
  const fs::path dir = fs::path(root) / name;
  if (name.empty() || !fs::exists(dir / kCommitted))
    corrupt(file.string(), fmt::format("names '{}', which is not a committed checkpoint", name));
  return dir.string();
}
}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& root) { return named_checkpoint(root, "latest"); }

std::optional<std::string> best_checkpoint(const std::string& root) { return named_checkpoint(root, "best"); }

std::vector<std::string> checkpoint_candidates(const std::string& root, std::vector<std::string>* skipped) {
  if (!fs::is_directory(root)) return {};
  std::vector<fs::path> candidates;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && step_of_name(name) && fs::exists(e.path() / kCommitted)) candidates.push_back(e.path());
  }
  std::sort(candidates.rbegin(), candidates.rend());
  // `latest` first (it may name an older one on purpose), then the rest from the newest.
  try {
    if (const auto latest = latest_checkpoint(root)) {
      const auto it = std::find(candidates.begin(), candidates.end(), fs::path(*latest));
      if (it != candidates.end()) std::rotate(candidates.begin(), it, std::next(it));
    }
  } catch (const Error& e) {
    if (skipped) skipped->push_back(e.what());
  }
  return std::vector<std::string>(candidates.begin(), candidates.end());
}

std::optional<std::string> usable_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  for (const auto& dir : checkpoint_candidates(root, skipped)) {
    try {
      Reader(dir).verify();
      return dir;
    } catch (const Error& e) {
      if (skipped) skipped->push_back(e.what());
    } catch (const std::exception& e) {  // whatever a damaged checkpoint provokes, the next one is tried
      if (skipped) skipped->push_back(fmt::format("checkpoint {}: {}", dir, e.what()));
    }
  }
  return std::nullopt;
}

Checkpoint load_checkpoint(const std::string& dir) {
  const Reader reader(dir);
  reader.verify();
  Checkpoint ck{dir, reader.state(), {}};
  for (const auto& t : reader.tensors()) {
    TensorData d{t.name, t.dtype, t.shape, std::string(static_cast<size_t>(t.numel() * dtype_size(t.dtype)), '\0')};
    reader.read(t.name, 0, t.numel(), d.bytes.data(), t.dtype);
    ck.tensors.push_back(std::move(d));
  }
  return ck;
}

namespace {
// Which rank files hold each sharded tensor (for inspect-ckpt).
std::map<std::string, std::vector<std::string>> files_of_sharded(const ShardTable& t) {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& prefix : t.prefixes)
    for (const auto& u : t.units)
      for (const auto& p : u.params) {
        auto& files = out[prefix + p.name];
        if (p.numel > 0)
          for (int64_t r = p.offset / u.chunk; r <= (p.offset + p.numel - 1) / u.chunk; ++r) files.push_back(shard_file_name(r));
      }
  return out;
}
}  // namespace

Inspection inspect_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' is not a directory", dir),
                "pass a checkpoint directory (run_dir/ckpt/step_XXXXXXXX) or a run's ckpt/ directory");
  Inspection in;
  in.dir = dir;
  in.committed = fs::exists(fs::path(dir) / kCommitted);
  const nlohmann::json m = read_manifest(dir);
  try {
    in.state = state_from(m, (fs::path(dir) / kManifest).string());
    const std::map<std::string, std::vector<std::string>> shard_files =
        m.contains("shards") ? files_of_sharded(shard_table_from(m.at("shards"), (fs::path(dir) / kManifest).string()))
                             : std::map<std::string, std::vector<std::string>>{};
    for (const auto& t : m.at("tensors")) {
      in.tensors.push_back({t.at("name"), t.at("dtype"), integers(t.at("shape"))});
      if (t.at("pieces").is_string()) {
        if (const auto it = shard_files.find(in.tensors.back().name); it != shard_files.end())
          in.files_of_tensor[in.tensors.back().name] = it->second;
        continue;
      }
      for (const auto& p : t.at("pieces")) {
        auto& files = in.files_of_tensor[in.tensors.back().name];
        const std::string f = p.at("file");
        if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
      }
    }
    for (const auto& f : m.at("files")) {
      FileCheck fc{f.at("name"), f.at("bytes"), true, ""};
      const std::string path = (fs::path(dir) / fc.name).string();
      std::error_code ec;
      if (!fs::exists(path, ec))
        fc.ok = false, fc.problem = "missing";
      else if (!is_plain_file_name(fc.name) || !fs::is_regular_file(path, ec))
        fc.ok = false, fc.problem = "not a plain file name or not a regular file";
      else if (fs::file_size(path, ec) != fc.bytes)
        fc.ok = false, fc.problem = fmt::format("{} bytes, expected {} (truncated)", fs::file_size(path, ec), fc.bytes);
      else if (crc32c_of_file(path) != integer<uint32_t>(f.at("crc32c")))
        fc.ok = false, fc.problem = "crc32c mismatch (corrupt)";
      if (!fc.ok) {
        std::vector<std::string> held;
        for (const auto& [tensor, files] : in.files_of_tensor)
          if (std::find(files.begin(), files.end(), fc.name) != files.end()) held.push_back(tensor);
        fc.problem += "; holds " + name_list(held);
      }
      in.files.push_back(fc);
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt((fs::path(dir) / kManifest).string(), fmt::format("missing or mistyped entry ({})", e.what()));
  }
  if (in.committed) {
    try {
      (void)Reader(dir, /*verified=*/true);  // the manifest's own checks; the files were checked above
    } catch (const Error& e) {
      in.manifest_problem = e.what();
    }
  }
  return in;
}

}  // namespace dstrain::ckpt
