#pragma once
// The nccl-tests-style collective benchmark, run by every rank of `dstrain bench comm` after the
// checks (comm/collective_check.h).
#include <cstdint>

#include "dstrain/comm/communicator.h"

namespace dstrain::comm {

struct BenchOptions {
  int64_t min_bytes = 1024;
  int64_t max_bytes = 256ll << 20;
  int64_t max_iters = 20;
};
// Times all_reduce, reduce_scatter, all_gather and all_to_all from min to max bytes (x4 steps); rank 0
// prints size, time, algbw and busbw per op, and an in-process memcpy bandwidth for scale.
void bench_collectives(Communicator& comm, const BenchOptions& options);

}  // namespace dstrain::comm
