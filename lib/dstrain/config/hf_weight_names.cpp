#include "dstrain/config/hf_weight_names.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace dstrain::config {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // safetensors' own limit

// The header of one safetensors file: {"name": {...}, ..., "__metadata__": {...}}.
bool safetensors_names(const std::string& file, const std::string& tensor) {
  std::ifstream in(file, std::ios::binary);
  unsigned char size_bytes[8] = {};
  if (!in.read(reinterpret_cast<char*>(size_bytes), 8)) return false;
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | size_bytes[i];  // little-endian
  if (size == 0 || size > kMaxHeaderBytes) return false;
  std::string header(size, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(size))) return false;
  const auto json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  return json.is_object() && json.contains(tensor);
}

}  // namespace

bool hf_folder_holds(const std::string& dir, const std::string& tensor) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    std::ifstream in(index);
    const auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return json.is_object() && json.contains("weight_map") && json["weight_map"].is_object() && json["weight_map"].contains(tensor);
  }
  return safetensors_names((fs::path(dir) / "model.safetensors").string(), tensor);
}

}  // namespace dstrain::config
