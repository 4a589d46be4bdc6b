#include "dstrain/core/threads.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace dstrain {

int threads_per_worker(int requested, int local_workers, int cores) {
  if (requested > 0) return requested;
  return std::max(1, cores / std::max(1, local_workers));
}

int online_cores() {
  // Respect the CPU affinity mask (taskset, cgroups, Slurm's --cpus-per-task).
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int node_cores() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

}  // namespace dstrain
