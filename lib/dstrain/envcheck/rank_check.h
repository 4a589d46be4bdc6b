#pragma once
// The environment check across ranks, and the same check as `train`'s preflight: every rank
// collects its facts (facts.h, with the config, recipe, ds_config and dataset files of the
// recipe), its clock offset from rank 0 and, for check-env, the probes (all-reduce correctness
// and bandwidth, pairwise links between nodes, GEMM throughput in per-node turns, checkpoint-dir
// write speed); rank 0 compares them (compare.h).
#include <string>

#include "dstrain/envcheck/compare.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}

namespace dstrain::envcheck {

struct ProbeOptions {
  bool allreduce = true;  // each probe can be skipped
  bool pairwise = true;
  bool gemm = true;
  bool disk = true;
  double max_clock_skew_s = 1.0;
  std::string device = "cpu";  // this rank's device (DSTRAIN_DEVICE): the GEMM probe runs there
};

// Gathers and compares every rank's facts (collective). Every rank returns; only rank 0's report
// is filled. `node`: this rank's node index; `recipe` may be null.
Report check_ranks(comm::Communicator& comm, int node, const config::Recipe* recipe, const ProbeOptions& probes);
// This process alone (check-env --local): its facts, and the GEMM and disk probes.
Report check_local(const config::Recipe* recipe, const ProbeOptions& probes);

// train's preflight in every worker: facts and clocks (no probes). A mismatch throws
// Error{kEnvironment} on every rank, after rank 0 has logged the report.
void preflight_env_check(comm::Communicator& comm, int node, const config::Recipe& recipe);

}  // namespace dstrain::envcheck
