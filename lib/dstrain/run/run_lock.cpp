#include "dstrain/run/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "dstrain/core/error.h"
#include "dstrain/core/host.h"

namespace dstrain::run {
namespace {

std::string command_line() {
  std::string cmd;
  if (FILE* f = std::fopen("/proc/self/cmdline", "rb")) {
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    for (size_t i = 0; i < n; ++i) cmd += buf[i] ? buf[i] : ' ';
  }
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  return cmd;
}

std::string read_holder(int fd) {
  char buf[600] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "another process (it has not written its name yet)" : text;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir, int node) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  const std::string path =
      (std::filesystem::path(run_dir) / (node == 0 ? std::string(".lock") : fmt::format(".lock.node{}", node))).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot open '{}': {}", path, std::strerror(errno)),
                "check that the run directory is writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_holder(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw Error(ErrorCode::kEnvironment, fmt::format("cannot lock '{}': {}", path, std::strerror(err)),
                  "the run directory's filesystem must support flock (local disks and NFSv4 do)");
    throw Error(ErrorCode::kUsage, fmt::format("run directory {} is in use by {}", run_dir, holder),
                "two runs must not write one run_dir: wait for that one to end (or stop it), or choose another run_dir");
  }
  const std::string me = fmt::format("pid {} on {}: {}\n", ::getpid(), host_name(), command_line());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    // the lock holds without the note; only the message to a second run is poorer
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace dstrain::run
