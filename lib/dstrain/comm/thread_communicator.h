#pragma once
// An in-process group: one Communicator per thread, all sharing memory ("threads as ranks").
// It has the Gloo communicator's semantics (CPU tensors; 16-bit tensors reduced in fp32), with
// sums taken in rank order, so results are deterministic. The Engine, the Checkpointer and the
// Trainer run on it in unit tests that take seconds instead of real processes.
// Every op completes before it returns (after every rank issued it); mismatched ops or a rank
// that never arrives within the timeout throw Error{kComm} naming the op and its sequence number.
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "dstrain/comm/communicator.h"

namespace dstrain::comm {

// `world_size` communicators of one group; communicator r is rank r.
std::vector<std::unique_ptr<Communicator>> make_thread_group(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Runs fn(rank's communicator) on `world_size` threads, one per rank, and joins them. The first
// exception (by rank) is rethrown after every thread ended; a rank that throws makes the others'
// pending ops fail instead of waiting out the timeout.
void run_on_threads(int world_size, const std::function<void(Communicator&)>& fn,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dstrain::comm
