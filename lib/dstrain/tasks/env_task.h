#pragma once
// `dstrain check-env` as a task: a launcher that starts this node's workers (or this process as
// one rank of a torchrun/srun/mpirun job) running envcheck::check_ranks, and the --local check.
#include <string>
#include <vector>

#include "dstrain/envcheck/rank_check.h"
#include "dstrain/launch/topology.h"

namespace dstrain::run {
struct WorkerEnv;
}

namespace dstrain::tasks {

struct EnvCheckTask {
  std::string config_path;  // a resolved config (config.resolved.json) or "" for no recipe
  envcheck::ProbeOptions probes;
  int timeout_s = 120;
  std::string report_path;  // rank 0 writes PATH.txt and PATH.json
};

// Worker-process arguments that carry the task (after "worker").
std::vector<std::string> env_task_args(const EnvCheckTask& task);

// This process as the rank env describes; rank 0 writes the report files (launcher) or prints
// it (print = true: torchrun/mpirun). Returns 0, or 1 (rank 0, a mismatch, print mode).
int run_env_task(const run::WorkerEnv& env, const EnvCheckTask& task, bool print);
// Launcher: the workers of this node run the task; node 0 prints the report (text, or JSON).
int launch_env_task(const launch::Topology& topology, const EnvCheckTask& task, bool json, const std::string& executable);
int run_env_task_as_rank(const launch::Topology& topology, const EnvCheckTask& task);
// --local: this process alone, no rendezvous, no probes but GEMM and disk.
int run_env_local(const EnvCheckTask& task, bool json);

}  // namespace dstrain::tasks
