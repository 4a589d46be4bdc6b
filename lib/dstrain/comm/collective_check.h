#pragma once
// Collective correctness checks, run by every rank of `dstrain bench comm` (launched by dstrain,
// mpirun, srun or torchrun) before its benchmark (bench/collective_bench.h).
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

}  // namespace dstrain::comm
