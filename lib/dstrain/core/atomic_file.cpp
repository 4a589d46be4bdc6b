#include "dstrain/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

[[noreturn]] void io_fail(const std::string& what, const std::string& path) {
  throw Error(ErrorCode::kEnvironment, what + " '" + path + "': " + std::strerror(errno),
              "check that the directory exists, is writable and the disk is not full");
}

std::string parent_dir(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open for fsync", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_fail("fsync failed for", path);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail("cannot create", tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("cannot write", tmp_);
    }
    done += static_cast<size_t>(n);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  const int fd = std::exchange(fd_, -1);
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;  // always closed, even when fsync failed
  if (!synced || !closed) {
    const int err = synced ? errno : sync_errno;
    ::unlink(tmp_.c_str());
    errno = err;  // the message names the flush's error (ENOSPC, EIO), not unlink's
    io_fail("cannot flush", tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    errno = err;
    io_fail("cannot rename into place", path_);
  }
  fsync_path(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void rename_atomic(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) io_fail("cannot rename '" + from + "' to", to);
  fsync_path(parent_dir(to));
}

void exchange_atomic(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS) io_fail("cannot exchange '" + from + "' with", to);
    std::error_code ec;
    std::filesystem::remove_all(to, ec);
    if (ec) io_fail("cannot remove", to);
    rename_atomic(from, to);
    return;
  }
  fsync_path(parent_dir(to));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorCode::kEnvironment, "cannot read '" + path + "': " + std::strerror(errno),
                "check that the file exists and is readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dstrain
