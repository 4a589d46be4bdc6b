#include "dstrain/core/threads.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace dstrain {

ThreadCount worker_threads(int requested, int local_workers, int cores, const char* omp_num_threads) {
  const int even = std::max(1, cores / std::max(1, local_workers));
  const std::string omp = omp_num_threads ? omp_num_threads : "";
  char* end = nullptr;
  const long omp_value = omp.empty() ? 0 : std::strtol(omp.c_str(), &end, 10);
  const bool omp_valid = !omp.empty() && end && *end == '\0' && omp_value > 0 && omp_value <= 4096;
  if (requested > 0) {
    ThreadCount t{requested, "launch.threads_per_worker", ""};
    if (omp_valid && omp_value != requested)
      t.warning = fmt::format("OMP_NUM_THREADS={} in the environment is overridden by launch.threads_per_worker={}", omp, requested);
    return t;
  }
  if (omp_valid) return {static_cast<int>(omp_value), fmt::format("OMP_NUM_THREADS={} from the environment", omp), ""};
  ThreadCount t{even, fmt::format("{} cores / {} local workers", cores, std::max(1, local_workers)), ""};
  if (!omp.empty())
    t.warning = fmt::format("OMP_NUM_THREADS='{}' in the environment is not a thread count; using {} threads per worker", omp, even);
  return t;
}

ThreadCount worker_threads(int requested, int local_workers, int cores) {
  return worker_threads(requested, local_workers, cores, std::getenv("OMP_NUM_THREADS"));
}

int threads_per_worker(int requested, int local_workers, int cores) { return worker_threads(requested, local_workers, cores).threads; }

int online_cores() {
  // Respect the CPU affinity mask (taskset, cgroups, Slurm's --cpus-per-task).
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int node_cores() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

}  // namespace dstrain
