#pragma once
// `dstrain check-env` across ranks, and the same check as `train`'s preflight: every rank
// collects its facts (envcheck/facts.h, with the config, recipe, ds_config and dataset files
// of the recipe), its clock offset from rank 0 and, for check-env, the probes (all-reduce
// correctness and bandwidth, pairwise links between nodes, GEMM throughput, checkpoint-dir
// write speed); rank 0 compares them (envcheck/compare.h).
#include <string>
#include <vector>

#include "dstrain/launch/topology.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::launch {
struct WorkerEnv;
}
namespace dstrain::envcheck {
struct Report;
}

namespace dstrain::train {

struct EnvCheckTask {
  std::string config_path;  // a resolved config (config.resolved.json) or "" for no recipe
  bool allreduce = true;    // probes; each can be skipped
  bool pairwise = true;
  bool gemm = true;
  bool disk = true;
  double max_clock_skew_s = 1.0;
  int timeout_s = 120;
  std::string report_path;  // rank 0 writes PATH.txt and PATH.json
  std::string device = "cpu";  // this rank's device (DSTRAIN_DEVICE): the GEMM probe runs there
};

// Worker-process arguments that carry the task (after "worker").
std::vector<std::string> env_task_args(const EnvCheckTask& task);

// Gathers and compares every rank's facts (and runs the probes the task asks for). Every rank
// returns; only rank 0's report is filled.
envcheck::Report check_ranks(comm::Communicator& comm, int node, const config::Recipe* recipe, const EnvCheckTask& task);

// This process as the rank env describes; rank 0 writes the report files (launcher) or prints
// it (print = true: torchrun/mpirun). Returns 0, or 1 (rank 0, a mismatch, print mode).
int run_env_task(const launch::WorkerEnv& env, const EnvCheckTask& task, bool print);
// Launcher: the workers of this node run the task; node 0 prints the report (text, or JSON).
int launch_env_task(const launch::Topology& topology, const EnvCheckTask& task, bool json, const std::string& executable);
int run_env_task_as_rank(const launch::Topology& topology, const EnvCheckTask& task);
// --local: this process alone, no rendezvous, no probes but GEMM and disk.
int run_env_local(const EnvCheckTask& task, bool json);

// train's preflight in every worker: facts and clocks (no probes). A mismatch throws
// Error{kEnvironment} on every rank, after rank 0 has logged the report.
void preflight_env_check(comm::Communicator& comm, int node, const config::Recipe& recipe);

}  // namespace dstrain::train
