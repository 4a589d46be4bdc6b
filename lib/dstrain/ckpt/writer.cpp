#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/ckpt/base_model.h"
#include "dstrain/ckpt/format.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/core/fault_injector.h"

namespace dstrain::ckpt {
namespace fs = std::filesystem;
using namespace detail;

namespace detail {
void corrupt(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {}: {}", where, what),
              "run `dstrain inspect-ckpt --verify` on it; `dstrain resume` falls back to the previous checkpoint that verifies");
}
void crash_point() { FaultInjector::get().save_point(); }

std::optional<int64_t> step_of_name(const std::string& name) {
  if (name.size() < 13 || name.size() > 23 || name.rfind("step_", 0) != 0) return std::nullopt;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  return std::stoll(name.substr(5));
}

bool is_staging_name(const std::string& name) {
  const std::string suffix = kPartialSuffix;
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         step_of_name(name.substr(0, name.size() - suffix.size()));
}

bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-'; });
}

std::string committed_text(int64_t step, uint32_t manifest_crc) {
  return fmt::format("step {}\nmanifest crc32c {:08x}\n", step, manifest_crc);
}

bool committed_matches(const std::string& text, uint32_t manifest_crc) {
  const std::string key = "manifest crc32c ";
  const auto at = text.find(key);
  if (at == std::string::npos) return true;  // written before the checksum existed
  const std::string hex = text.substr(at + key.size(), 8);
  return hex.size() == 8 && hex.find_first_not_of("0123456789abcdef") == std::string::npos &&
         static_cast<uint32_t>(std::stoul(hex, nullptr, 16)) == manifest_crc;
}
}  // namespace detail

namespace {

nlohmann::json piece_json(const Piece& p) { return {{"tensor", p.tensor}, {"start", p.start}, {"count", p.count}, {"offset", p.offset}}; }
Piece piece_from(const nlohmann::json& j) {
  return {j.at("tensor").get<std::string>(), j.at("start").get<int64_t>(), j.at("count").get<int64_t>(), j.at("offset").get<uint64_t>()};
}

nlohmann::json shard_table_json(const ShardTable& t) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : t.units) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : u.params) params.push_back({p.name, p.offset, p.numel});
    units.push_back({{"chunk", u.chunk}, {"params", params}});
  }
  return {{"ranks", t.ranks}, {"prefixes", t.prefixes}, {"units", units}};
}

// The tensors the table covers (each once, float32, of the table's size), with every rank's file
// there and at least as large as its shards (its listed pieces come after them).
std::set<std::string> check_shard_table(const ShardTable& table, const std::vector<TensorMeta>& tensors,
                                        const std::vector<ShardFile>& files) {
  auto bug = [](const std::string& what) { throw Error(ErrorCode::kInternal, "checkpoint shard table: " + what, "this is a dstrain bug"); };
  std::map<std::string, const TensorMeta*> meta;
  for (const auto& t : tensors) meta[t.name] = &t;
  std::set<std::string> covered;
  for (const auto& prefix : table.prefixes)
    for (const auto& u : table.units)
      for (const auto& p : u.params) {
        const auto it = meta.find(prefix + p.name);
        if (it == meta.end() || it->second->dtype != "float32" || it->second->numel() != p.numel) bug("tensor " + prefix + p.name);
        if (!covered.insert(prefix + p.name).second) bug("tensor " + prefix + p.name + " twice");
      }
  std::map<std::string, const ShardFile*> by_name;
  for (const auto& f : files) by_name[f.name] = &f;
  for (int64_t r = 0; r < table.ranks; ++r) {
    const auto it = by_name.find(shard_file_name(r));
    const uint64_t shard_bytes = static_cast<uint64_t>(table.rank_elements(r)) * table.prefixes.size() * 4;
    if (it == by_name.end() || it->second->bytes < shard_bytes) bug("rank " + std::to_string(r) + "'s file is missing or short");
    for (const auto& p : it->second->pieces)
      if (p.offset < shard_bytes) bug("a piece of " + it->first + " overlaps its shards");
  }
  return covered;
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Deletes committed checkpoints older than `newest` that the policy does not keep, and the
// leftovers of crashed saves. Never touches `newest` or anything newer.
void prune(const std::string& root, int64_t newest, Retention retention) {
  std::vector<std::pair<int64_t, fs::path>> committed;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (is_staging_name(name)) {  // step_X.partial of a crashed save (not ours: ours was renamed)
      fs::remove_all(e.path());
      continue;
    }
    const std::optional<int64_t> step = step_of_name(name);
    if (!step) continue;  // not a name dstrain writes: a user's copy, never touched
    if (!fs::exists(e.path() / kCommitted)) {
      if (*step < newest) fs::remove_all(e.path());  // renamed by a save that crashed before committing
      continue;
    }
    if (*step <= newest) committed.emplace_back(*step, e.path());
  }
  std::sort(committed.begin(), committed.end());
  if (retention.keep_last <= 0 || static_cast<int64_t>(committed.size()) <= retention.keep_last) return;
  for (size_t i = 0; i + static_cast<size_t>(retention.keep_last) < committed.size(); ++i)
    if ((retention.keep_every <= 0 || committed[i].first % retention.keep_every != 0) && committed[i].first != retention.best_step) {
      // Uncommit first: a crash halfway through removing leaves no half checkpoint that claims to be whole.
      fs::remove(committed[i].second / kCommitted);
      crash_point();
      fs::remove_all(committed[i].second);
    }
}

}  // namespace

int64_t ShardTable::rank_elements(int64_t rank) const { return rank_unit_starts(rank).back(); }

std::vector<int64_t> ShardTable::rank_unit_starts(int64_t rank) const {
  std::vector<int64_t> starts{0};
  starts.reserve(units.size() + 1);
  for (const Unit& u : units) {
    const int64_t lo = rank * u.chunk, hi = lo + u.chunk;
    int64_t n = 0;
    for (const Param& p : u.params) n += std::max<int64_t>(0, std::min(hi, p.offset + p.numel) - std::max(lo, p.offset));
    starts.push_back(starts.back() + n);
  }
  return starts;
}

std::string shard_file_name(int64_t rank) { return fmt::format("rank_{:05d}.bin", rank); }

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t dtype_size(const std::string& dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "float64") return 8;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  if (dtype == "int64") return 8;
  corrupt(dtype, "unknown dtype");
}

std::string to_json(const ShardFile& f) {
  nlohmann::json j{{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}, {"pieces", nlohmann::json::array()}};
  for (const auto& p : f.pieces) j["pieces"].push_back(piece_json(p));
  return j.dump();
}

ShardFile shard_file_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  ShardFile f{j.at("name"), j.at("bytes"), j.at("crc32c"), {}};
  for (const auto& p : j.at("pieces")) f.pieces.push_back(piece_from(p));
  return f;
}

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::string staging_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / (step_dir_name(step) + kPartialSuffix)).string();
}

std::string prepare_staging(const std::string& root, int64_t step) {
  const std::string dir = staging_dir(root, step);
  fs::create_directories(root);
  fs::remove_all(dir);  // a crashed save of the same step
  fs::create_directories(dir);
  return dir;
}

ShardFile write_shard(const std::string& staging, int rank, const std::vector<TensorMeta>& tensors, const std::vector<PieceView>& pieces) {
  std::map<std::string, const TensorMeta*> meta;
  for (const auto& t : tensors) meta[t.name] = &t;
  ShardFile f;
  f.name = shard_file_name(rank);
  const std::string path = (fs::path(staging) / f.name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::kEnvironment, fmt::format("cannot create '{}'", path), "check the checkpoint directory is writable");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceView& p = pieces[i];
    if (i == pieces.size() / 2) crash_point();  // half written, nothing flushed
    const auto it = meta.find(p.tensor);
    if (it == meta.end()) throw Error(ErrorCode::kInternal, "checkpoint piece of unknown tensor " + p.tensor, "this is a dstrain bug");
    const uint64_t bytes = static_cast<uint64_t>(p.count * dtype_size(it->second->dtype));
    out.write(static_cast<const char*>(p.data), static_cast<std::streamsize>(bytes));
    f.crc32c = crc32c(p.data, bytes, f.crc32c);
    f.pieces.push_back({p.tensor, p.start, p.count, f.bytes});
    f.bytes += bytes;
  }
  crash_point();  // all written, not flushed
  out.flush();
  if (!out) {
    const int err = errno;
    out.close();
    std::error_code ec;
    fs::remove(path, ec);  // a partial shard must not keep the disk full
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}': {}", path, std::strerror(err)),
                "check free disk space (`df -h`); the previous checkpoint is intact");
  }
  out.close();
  fsync_path(path);
  crash_point();  // on disk, not yet in any manifest
  return f;
}

std::string commit(const std::string& root, TrainState state, const std::vector<TensorMeta>& tensors, const std::vector<ShardFile>& files,
                   Retention retention, const ShardTable* table) {
  // Every tensor must be covered exactly once: a gap or an overlap is a bug, caught before commit.
  const std::set<std::string> by_table = table ? check_shard_table(*table, tensors, files) : std::set<std::string>{};
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (const auto& f : files)
    for (const auto& p : f.pieces) ranges[p.tensor].push_back({p.start, p.count});
  for (const auto& t : tensors) {
    if (by_table.count(t.name)) {
      if (ranges.count(t.name))
        throw Error(ErrorCode::kInternal, "checkpoint: tensor " + t.name + " is in the shard table and in pieces", "this is a dstrain bug");
      continue;
    }
    auto& r = ranges[t.name];
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (const auto& [start, count] : r) {
      if (start != next)
        throw Error(ErrorCode::kInternal, fmt::format("checkpoint: tensor {} pieces leave a gap or overlap at {}", t.name, next),
                    "this is a dstrain bug");
      next += count;
    }
    if (next != t.numel())
      throw Error(ErrorCode::kInternal, fmt::format("checkpoint: tensor {} covered to {} of {}", t.name, next, t.numel()),
                  "this is a dstrain bug");
  }
  state.created = utc_now();
  nlohmann::json m;
  m["format"] = kFormatName;
  m["format_version"] = state.base.empty() ? 3 : kFormatVersion;  // an older dstrain reads what needs no base
  m["step"] = state.step;
  m["samples_consumed"] = state.samples_consumed;
  m["tokens_consumed"] = state.tokens_consumed;
  m["world_size"] = state.world_size;
  m["zero_stage"] = state.zero_stage;
  m["precision"] = state.precision;
  m["config_hash"] = state.config_hash;
  m["model"] = state.model;
  m["created"] = state.created;
  if (!state.base.empty()) m["base"] = nlohmann::json::parse(to_json(state.base));
  std::map<std::string, nlohmann::json> pieces_of;
  for (const auto& f : files)
    for (const auto& p : f.pieces)
      pieces_of[p.tensor].push_back({{"file", f.name}, {"offset", p.offset}, {"start", p.start}, {"count", p.count}});
  m["tensors"] = nlohmann::json::array();
  for (const auto& t : tensors)
    m["tensors"].push_back({{"name", t.name},
                            {"dtype", t.dtype},
                            {"shape", t.shape},
                            {"pieces", by_table.count(t.name) ? nlohmann::json(kShardPieces) : pieces_of[t.name]}});
  if (table) m["shards"] = shard_table_json(*table);
  m["files"] = nlohmann::json::array();
  for (const auto& f : files) m["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  const std::string staging = staging_dir(root, state.step);
  const std::string manifest_text = m.dump(1) + "\n";
  write_file_atomic((fs::path(staging) / kManifest).string(), manifest_text);
  fsync_path(staging);
  crash_point();  // complete but uncommitted, under the staging name

  // Commit: the directory appears whole under its final name, then the marker, then `latest`.
  const fs::path final_dir = fs::path(root) / step_dir_name(state.step);
  const std::string committed = committed_text(state.step, crc32c(manifest_text.data(), manifest_text.size()));
  if (fs::exists(final_dir / kCommitted)) {
    // The same step saved again (a rollback, a resumed run): the new copy is committed under
    // the staging name and swapped in atomically, so a committed copy (perhaps the one `latest`
    // names) is under the final name at every instant; then the old one is removed.
    write_file_atomic((fs::path(staging) / kCommitted).string(), committed);
    exchange_atomic(staging, final_dir.string());
    crash_point();  // swapped: the old copy is under the staging name
    fs::remove_all(staging);
  } else {
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // an uncommitted copy of this step
    rename_atomic(staging, final_dir.string());
    crash_point();  // renamed, not COMMITTED
    write_file_atomic((final_dir / kCommitted).string(), committed);
  }
  fsync_path(root);
  crash_point();  // COMMITTED, `latest` still names the previous one
  write_file_atomic((fs::path(root) / "latest").string(), step_dir_name(state.step) + "\n");
  if (retention.best_step == state.step) write_file_atomic((fs::path(root) / "best").string(), step_dir_name(state.step) + "\n");
  crash_point();  // `latest` moved, nothing pruned
  prune(root, state.step, retention);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& root, const TrainState& state, const std::vector<TensorView>& tensors, Retention retention) {
  const std::string staging = prepare_staging(root, state.step);
  std::vector<TensorMeta> metas;
  std::vector<PieceView> pieces;
  for (const auto& t : tensors) {
    metas.push_back({t.name, t.dtype, t.shape});
    pieces.push_back({t.name, 0, metas.back().numel(), t.data});
  }
  return commit(root, state, metas, {write_shard(staging, 0, metas, pieces)}, retention);
}

}  // namespace dstrain::ckpt
