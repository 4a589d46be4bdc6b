#include "dstrain/ckpt/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"

namespace dstrain::ckpt {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTensorFile = "tensors.bin";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kCommitted = "COMMITTED";
constexpr const char* kFormatName = "dstrain-checkpoint";

[[noreturn]] void corrupt(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {}: {}", where, what),
              "run `dstrain inspect-ckpt` on it; resume from an older checkpoint by removing this one (or fixing `latest`)");
}

void write_tensor_file(const std::string& path, const std::vector<TensorView>& tensors, uint32_t& crc, uint64_t& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::kEnvironment, fmt::format("cannot create '{}'", path), "check the checkpoint directory is writable");
  crc = 0;
  bytes = 0;
  for (const auto& t : tensors) {
    out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
    crc = crc32c(t.data, t.nbytes, crc);
    bytes += t.nbytes;
  }
  out.flush();
  if (!out) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}'", path), "check free disk space");
  out.close();
  fsync_path(path);
}

nlohmann::json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  if (!fs::exists(path)) corrupt(dir, "manifest.json is missing");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, fmt::format("not valid JSON ({})", e.what()));
  }
  if (m.value("format", "") != kFormatName) corrupt(path, "not a dstrain checkpoint manifest");
  if (m.value("format_version", 0) != kFormatVersion)
    corrupt(path, fmt::format("format_version {} is not supported (this dstrain reads {})", m.value("format_version", 0), kFormatVersion));
  return m;
}

TrainState state_from(const nlohmann::json& m) {
  TrainState s;
  s.step = m.at("step").get<int64_t>();
  s.samples_consumed = m.at("samples_consumed").get<int64_t>();
  s.world_size = m.at("world_size").get<int64_t>();
  s.config_hash = m.at("config_hash").get<std::string>();
  return s;
}

std::vector<TensorData> tensors_from(const nlohmann::json& m) {
  std::vector<TensorData> out;
  for (const auto& t : m.at("tensors")) out.push_back({t.at("name"), t.at("dtype"), t.at("shape").get<std::vector<int64_t>>(), {}});
  return out;
}

int64_t step_of(const fs::path& dir) { return std::stoll(dir.filename().string().substr(5)); }

void remove_old(const std::string& root, Retention retention) {
  std::vector<fs::path> committed;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step_", 0) != 0) continue;
    if (name.find(".tmp") != std::string::npos) fs::remove_all(e.path());  // a crashed save's leftovers
    else if (fs::exists(e.path() / kCommitted)) committed.push_back(e.path());
  }
  std::sort(committed.begin(), committed.end());
  if (retention.keep_last <= 0 || static_cast<int64_t>(committed.size()) <= retention.keep_last) return;
  for (size_t i = 0; i + static_cast<size_t>(retention.keep_last) < committed.size(); ++i)
    if (retention.keep_every <= 0 || step_of(committed[i]) % retention.keep_every != 0) fs::remove_all(committed[i]);
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::string save_checkpoint(const std::string& root, const TrainState& state, const std::vector<TensorView>& tensors, Retention retention) {
  fs::create_directories(root);
  const std::string name = step_dir_name(state.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / fmt::format("{}.tmp{}", name, ::getpid());
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  uint32_t crc = 0;
  uint64_t total = 0;
  write_tensor_file((tmp_dir / kTensorFile).string(), tensors, crc, total);

  nlohmann::json m;
  m["format"] = kFormatName;
  m["format_version"] = kFormatVersion;
  m["step"] = state.step;
  m["samples_consumed"] = state.samples_consumed;
  m["world_size"] = state.world_size;
  m["config_hash"] = state.config_hash;
  uint64_t offset = 0;
  m["tensors"] = nlohmann::json::array();
  for (const auto& t : tensors) {
    m["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"file", kTensorFile}, {"offset", offset}, {"bytes", t.nbytes}});
    offset += t.nbytes;
  }
  m["files"] = nlohmann::json::array({{{"name", kTensorFile}, {"bytes", total}, {"crc32c", crc}}});
  write_file_atomic((tmp_dir / kManifest).string(), m.dump(1) + "\n");

  // Commit: the directory appears whole under its final name, then the marker, then `latest`.
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // an uncommitted or superseded copy
  rename_atomic(tmp_dir.string(), final_dir.string());
  write_file_atomic((final_dir / kCommitted).string(), fmt::format("step {}\n", state.step));
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  remove_old(root, retention);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  const fs::path latest = fs::path(root) / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name = read_file(latest.string());
  name.erase(std::remove_if(name.begin(), name.end(), [](char c) { return c == '\n' || c == '\r' || c == ' '; }), name.end());
  const fs::path dir = fs::path(root) / name;
  if (name.empty() || !fs::exists(dir / kCommitted))
    corrupt(latest.string(), fmt::format("names '{}', which is not a committed checkpoint", name));
  return dir.string();
}

Checkpoint load_checkpoint(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / kCommitted)) corrupt(dir, "has no COMMITTED marker (the save did not finish)");
  const nlohmann::json m = read_manifest(dir);
  Checkpoint ck;
  ck.dir = dir;
  std::string blob;
  try {
    ck.state = state_from(m);
    ck.tensors = tensors_from(m);
    const auto& f = m.at("files").at(0);
    const std::string path = (fs::path(dir) / f.at("name").get<std::string>()).string();
    if (!fs::exists(path)) corrupt(dir, fmt::format("{} is missing", f.at("name").get<std::string>()));
    blob = read_file(path);
    if (blob.size() != f.at("bytes").get<uint64_t>())
      corrupt(path, fmt::format("has {} bytes, the manifest says {}", blob.size(), f.at("bytes").get<uint64_t>()));
    if (crc32c(blob.data(), blob.size()) != f.at("crc32c").get<uint32_t>()) corrupt(path, "checksum mismatch (the file is corrupt)");
    const auto& ts = m.at("tensors");
    for (size_t i = 0; i < ts.size(); ++i) {
      const uint64_t offset = ts[i].at("offset"), bytes = ts[i].at("bytes");
      if (offset + bytes > blob.size()) corrupt(path, fmt::format("tensor {} lies outside the file", ck.tensors[i].name));
      ck.tensors[i].bytes = blob.substr(offset, bytes);
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt((fs::path(dir) / kManifest).string(), fmt::format("missing or mistyped entry ({})", e.what()));
  }
  return ck;
}

Inspection inspect_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' is not a directory", dir), "pass a checkpoint directory (run_dir/ckpt/step_XXXXXXXX) or a run's ckpt/ directory");
  Inspection in;
  in.dir = dir;
  in.committed = fs::exists(fs::path(dir) / kCommitted);
  const nlohmann::json m = read_manifest(dir);
  try {
    in.state = state_from(m);
    in.tensors = tensors_from(m);
    for (const auto& f : m.at("files")) {
      FileCheck fc{f.at("name"), f.at("bytes"), true, ""};
      const std::string path = (fs::path(dir) / fc.name).string();
      if (!fs::exists(path)) {
        fc.ok = false, fc.problem = "missing";
      } else {
        const std::string blob = read_file(path);
        if (blob.size() != fc.bytes) fc.ok = false, fc.problem = fmt::format("{} bytes, expected {}", blob.size(), fc.bytes);
        else if (crc32c(blob.data(), blob.size()) != f.at("crc32c").get<uint32_t>()) fc.ok = false, fc.problem = "crc32c mismatch";
      }
      in.files.push_back(fc);
    }
  } catch (const nlohmann::json::exception& e) {
    corrupt((fs::path(dir) / kManifest).string(), fmt::format("missing or mistyped entry ({})", e.what()));
  }
  return in;
}

}  // namespace dstrain::ckpt
