#pragma once
// Collective correctness checks and the nccl-tests-style benchmark, run by every rank of
// `dstrain bench comm` (launched by dstrain, mpirun, srun or torchrun).
#include <cstdint>
#include <string>

#include "dstrain/comm/communicator.h"

namespace dstrain::comm {

// Every collective on random data of odd sizes, float32 and bfloat16, against a reference each
// rank computes locally from all ranks' (seeded) inputs. Rank 0 prints one line per check.
// Returns the number of failed checks (0: all passed).
int check_collectives(Communicator& comm, uint64_t seed);

// Runs the control ops (barrier, broadcast, all_reduce, all_gather_bytes) and rank 0 prints the
// fewest and most sockets a rank holds then, against the N-1 a full mesh needs.
void report_control_sockets(Communicator& comm);

struct BenchOptions {
  int64_t min_bytes = 1024;
  int64_t max_bytes = 256ll << 20;
  int64_t max_iters = 20;
};
// Times all_reduce, reduce_scatter, all_gather and all_to_all from min to max bytes (x4 steps); rank 0
// prints size, time, algbw and busbw per op, and an in-process memcpy bandwidth for scale.
void bench_collectives(Communicator& comm, const BenchOptions& options);

}  // namespace dstrain::comm
