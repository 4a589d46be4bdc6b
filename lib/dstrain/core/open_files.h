#pragma once
// The open-files limit at scale (issue 26): node 0's store holds a connection per rank, and a
// worker whose Gloo group carries the data plane (CPU training, ZeRO's all-to-all) connects to
// every other rank, so a 1,024 soft limit stops a job near 1k ranks.
// dstrain raises the soft limit to the hard one at start, as torchrun users do by hand, and
// check-env says when even the hard limit is too low for the job.
#include <cstdint>

namespace dstrain {

struct OpenFilesLimit {
  uint64_t before = 0, soft = 0, hard = 0;  // RLIM_INFINITY shows as UINT64_MAX
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the limits before and after.
OpenFilesLimit raise_open_files_limit();
// Descriptors a rank of a job of `world_size` ranks may need: a socket per peer, a few store
// connections, and files (checkpoint shards, logs, data).
uint64_t open_files_needed(int64_t world_size);
// This process's open sockets (Linux: /proc/self/fd); -1 where that cannot be read.
int64_t open_socket_count();

}  // namespace dstrain
