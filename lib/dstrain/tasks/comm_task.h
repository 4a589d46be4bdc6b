#pragma once
// `dstrain bench comm`: the collective check and benchmark, as a launcher (spawning local
// workers like `train`) or as one rank of an mpirun/srun/torchrun job.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/bench/collective_bench.h"
#include "dstrain/comm/collective_check.h"
#include "dstrain/launch/topology.h"

namespace dstrain::run {
struct WorkerEnv;
}
namespace dstrain::comm {
class StoreServer;
}

namespace dstrain::tasks {

struct CommTask {
  bool check = false;            // correctness instead of timing
  std::string backend = "auto";  // gloo, nccl, or auto (nccl when this rank has a GPU)
  comm::BenchOptions bench;
  int timeout_s = 300;
};

// The rendezvous of a one-off task (bench comm, check-env): node 0 hosts a store under a fresh
// run key "<kind><random>/0"; the other nodes' launchers fetch that key from it.
struct TaskRendezvous {
  std::unique_ptr<comm::StoreServer> store;  // node 0 only
  std::string run_key;
  int port = 0;
  TaskRendezvous();
  TaskRendezvous(TaskRendezvous&&) noexcept;
  ~TaskRendezvous();
};
TaskRendezvous task_rendezvous(const launch::Topology& topology, const std::string& kind, std::chrono::seconds timeout);

// Worker-process arguments that carry the task (after "worker").
std::vector<std::string> comm_task_args(const CommTask& task);
// Runs the task in this process as the rank described by env; returns the exit status.
int run_comm_task(const run::WorkerEnv& env, const CommTask& task);
// Launcher: starts topology.nproc_per_node workers running the task and supervises them.
int launch_comm_task(const launch::Topology& topology, const CommTask& task, const std::string& executable);
// One rank of an mpirun/srun/torchrun job.
int run_comm_task_as_rank(const launch::Topology& topology, const CommTask& task);

}  // namespace dstrain::tasks
