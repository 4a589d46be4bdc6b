#pragma once
// An exclusive lock on a run directory for the lifetime of the process that trains into it
// (node 0's launcher, or rank 0 under torchrun/srun): a second `train` or `resume` of the same
// run_dir is refused at once, naming the holder, instead of two runs writing one ckpt/ and
// metrics.jsonl. flock(2) on RUN_DIR/.lock: released by the kernel when the holder exits,
// however it ends (no stale lock after a crash or SIGKILL).
#include <string>

namespace dstrain::run {

class RunDirLock {
 public:
  // Creates run_dir if needed. Node 0 locks RUN_DIR/.lock, node N > 0 RUN_DIR/.lock.nodeN (a
  // run_dir on a filesystem that every node shares is locked once per node). Throws
  // Error{kUsage} naming the holder's pid, host and command when another process holds it.
  explicit RunDirLock(const std::string& run_dir, int node = 0);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace dstrain::run
