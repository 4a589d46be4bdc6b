#include "dstrain/core/open_files.h"

#include <sys/resource.h>

#include <algorithm>
#include <limits>

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

}  // namespace dstrain
