#include "dstrain/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "dstrain/core/error.h"

namespace dstrain::data {

MappedFile::MappedFile(const std::string& path) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kData, fmt::format("data file '{}': {}", path, what),
                 "check data.path and data.format in the recipe; re-create the file if it is damaged");
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad(fmt::format("cannot open it: {}", std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) data_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    throw bad(fmt::format("cannot map it: {}", std::strerror(errno)));
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace dstrain::data
