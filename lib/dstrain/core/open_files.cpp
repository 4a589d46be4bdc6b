#include "dstrain/core/open_files.h"

#include <sys/resource.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string_view>
#include <system_error>

namespace dstrain {
namespace {
uint64_t shown(rlim_t v) { return v == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(v); }
}  // namespace

OpenFilesLimit raise_open_files_limit() {
  OpenFilesLimit out;
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return out;
  out.before = out.soft = shown(r.rlim_cur);
  out.hard = shown(r.rlim_max);
  if (r.rlim_cur != r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) out.soft = out.hard;
  }
  return out;
}

uint64_t open_files_needed(int64_t world_size) { return static_cast<uint64_t>(std::max<int64_t>(world_size, 1)) + 256; }

int64_t open_socket_count() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/fd", ec), end;
  if (ec) return -1;
  int64_t sockets = 0;
  for (; it != end; it.increment(ec)) {
    if (ec) return -1;
    char target[64];
    const ssize_t n = ::readlink(it->path().c_str(), target, sizeof(target) - 1);
    if (n > 7 && std::string_view(target, 7) == "socket:") ++sockets;
  }
  return sockets;
}

}  // namespace dstrain
