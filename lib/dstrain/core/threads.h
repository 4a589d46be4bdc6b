#pragma once
// How many intra-op threads a worker uses. LibTorch defaults to 1 on these machines, so dstrain
// always sets the count: the recipe's launch.threads_per_worker when given, else OMP_NUM_THREADS
// from the launcher's environment (as torchrun honours it), else the node's cores divided evenly
// among the local workers (at least 1).
#include <string>

namespace dstrain {

struct ThreadCount {
  int threads = 1;
  std::string why;      // for the log: "launch.threads_per_worker", "OMP_NUM_THREADS=4 from the environment", ...
  std::string warning;  // non-empty when the environment asked for another count that is not used
};
// `omp_num_threads`: the environment's OMP_NUM_THREADS, or nullptr.
ThreadCount worker_threads(int requested, int local_workers, int online_cores, const char* omp_num_threads);
// The same with this process's OMP_NUM_THREADS.
ThreadCount worker_threads(int requested, int local_workers, int online_cores);
int threads_per_worker(int requested, int local_workers, int online_cores);
int online_cores();  // in this process's CPU affinity mask
int node_cores();    // online on the machine, whatever the mask

}  // namespace dstrain
