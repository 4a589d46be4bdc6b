#pragma once
// Helpers shared by the unit tests.
#include <cstdlib>
#include <filesystem>
#include <string>

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
