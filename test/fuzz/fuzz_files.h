#pragma once
// For the file-reader fuzz targets: one scratch directory per process, and the input's parts
// (split at a 4-byte little-endian length prefix) written into files there.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace fuzz {

inline const std::string& scratch() {
  static const std::string dir = [] {
    char pattern[] = "/tmp/dstrain-fuzz-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (!made) std::abort();
    return std::string(made);
  }();
  return dir;
}

inline void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Takes the next part: a 4-byte length (clamped to what is left), then that many bytes.
inline std::string take(const uint8_t*& data, size_t& size) {
  if (size < 4) {
    std::string rest(reinterpret_cast<const char*>(data), size);
    data += size, size = 0;
    return rest;
  }
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  data += 4, size -= 4;
  n = static_cast<uint32_t>(std::min<size_t>(n, size));
  std::string part(reinterpret_cast<const char*>(data), n);
  data += n, size -= n;
  return part;
}

}  // namespace fuzz
