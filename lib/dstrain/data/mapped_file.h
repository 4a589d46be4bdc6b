#pragma once
// A read-only memory mapping of a whole file (token files, loss masks). Opening or mapping
// failures are Error{kData} naming the file.
#include <cstddef>
#include <cstdint>
#include <string>

namespace dstrain::data {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dstrain::data
