#pragma once
// Helpers shared by the unit tests.
#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <string>
#include <type_traits>

#include "dstrain/config/enums.h"

// Catch prints the recipe's enums by their names.
namespace dstrain::config {
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
std::ostream& operator<<(std::ostream& out, E value) {
  return out << name(value);
}
}  // namespace dstrain::config

namespace dstrain::test {

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dstrain-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The source tree root (set by CMake).
inline std::string source_dir() { return DSTRAIN_SOURCE_DIR; }

}  // namespace dstrain::test
