#pragma once
// Gathers through the run's store (internal to comm/: the Gloo and NCCL communicators use it).
// Rank 0 alone needs checkpoint summaries and environment facts; an all-gather would send all
// of them into every rank (21 MB of facts, or 1.35 GB of summaries, per rank at 16k ranks:
// issue 26), and a Gloo gather would connect the root to every rank. Through the store, each rank
// writes one key and the root reads them all in a few batched requests.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dstrain::comm {

struct StoreGather {
  c10d::Store* store;
  std::string prefix;  // e.g. "dstrain/<run>/gather/"; the round number is appended
  int rank, world;
  std::chrono::milliseconds timeout;
};

// Every rank's `mine` to `root` (others get an empty vector). Blocks every rank until the root has
// read all: each round's keys are then deleted by their writers, so the store does not grow with
// every checkpoint. `round` counts this communicator's gathers (the same on every rank).
// A timeout throws Error{kComm} naming up to 32 ranks that never wrote.
std::vector<std::string> store_gather_bytes(const StoreGather& g, uint64_t round, const std::string& mine, int root);

}  // namespace dstrain::comm
