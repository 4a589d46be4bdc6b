#include "dstrain/ckpt/base_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/core/file_checksum.h"

namespace dstrain::ckpt {
namespace fs = std::filesystem;

BaseModel identify_base(const std::string& folder) {
  BaseModel base;
  std::error_code ec;
  base.path = fs::absolute(folder, ec).lexically_normal().string();
  if (ec) base.path = folder;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") names.push_back(entry.path().filename().string());
  if (ec || names.empty())
    throw Error(ErrorCode::kCheckpoint, fmt::format("the base {} holds no .safetensors file{}", folder, ec ? ": " + ec.message() : ""),
                "model.init_from names the Hugging Face folder the adapters belong to");
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const FileSum sum = file_checksum((fs::path(folder) / name).string());
    base.files.push_back({name, sum.size, sum.crc32c});
  }
  return base;
}

std::string base_difference(const BaseModel& then, const BaseModel& now) {
  std::map<std::string, const BaseFile*> theirs;
  for (const auto& f : then.files) theirs[f.name] = &f;
  for (const auto& f : now.files) {
    const auto it = theirs.find(f.name);
    if (it == theirs.end()) return fmt::format("{} is not a file of the checkpoint's base", f.name);
    if (it->second->bytes != f.bytes) return fmt::format("{}: {} bytes, the checkpoint's base had {}", f.name, f.bytes, it->second->bytes);
    if (it->second->crc32c != f.crc32c)
      return fmt::format("{}: CRC-32C {:08x}, the checkpoint's base had {:08x}", f.name, f.crc32c, it->second->crc32c);
    theirs.erase(it);
  }
  if (!theirs.empty()) return fmt::format("{} of the checkpoint's base is missing", theirs.begin()->first);
  return "";
}

void check_checkpoint_base(const std::string& dir, const BaseModel& then, const BaseModel& now) {
  const std::string difference = base_difference(then, now);
  if (difference.empty()) return;
  if (then.path == now.path)
    throw Error(
        ErrorCode::kCheckpoint,
        fmt::format("checkpoint {} holds adapters trained on the base {}, whose files have changed since: {}", dir, then.path, difference),
        "put the base's files back as they were trained on, or start a new LoRA run on this base");
  throw Error(ErrorCode::kCheckpoint,
              fmt::format("checkpoint {} holds adapters trained on the base {}, and model.init_from {} is another model: {}", dir,
                          then.path, now.path, difference),
              fmt::format("set model.init_from to the base the adapters belong to ({}: {} file{})", then.path, then.files.size(),
                          then.files.size() == 1 ? "" : "s"));
}

std::string to_json(const BaseModel& base) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : base.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  return nlohmann::json{{"path", base.path}, {"files", files}}.dump();
}

BaseModel base_model_from_json(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json);
  BaseModel base;
  base.path = j.at("path").get<std::string>();
  for (const auto& f : j.at("files")) base.files.push_back({f.at("name"), f.at("bytes"), f.at("crc32c")});
  return base;
}

}  // namespace dstrain::ckpt
