#pragma once
// `dstrain bench control-plane` (issue 26): the control plane of a large job simulated in one
// process. Fake ranks are threads that run dstrain's real rendezvous (join_store) against the
// real store server; then, through the same store connections:
//  - Gloo's setup as its TCP transport drives the store: a full mesh (each rank publishes its
//    address plus N pair ids and reads every rank's key, N^2 bytes) against lazy pairs (one
//    address each; a rank reads only the peers the ring and tree collectives reach);
//  - the environment check's facts gathered to rank 0 (store_gather_bytes, the real code);
//  - node 0's liveness pass over every rank's signed heartbeat through the real StoreClient, the
//    old way (a check and a get per rank) and batched (try_get_many).
// The store server runs in a child process (as node 0's launcher is another process than its
// ranks); this one holds a descriptor per fake rank, so the open-files limit bounds N.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::comm {

struct ControlPlanePhase {
  std::string name;  // e.g. "rendezvous", "gloo setup (lazy pairs)", "heartbeat pass (batched)"
  double seconds = 0;
  int64_t operations = 0;  // store requests the phase made, as counted by the caller's protocol
  int64_t bytes = 0;       // payload the phase read from the store, all ranks together
};

struct ControlPlaneOptions {
  int ranks = 1024;
  std::chrono::seconds timeout{600};
  int full_mesh_up_to = 1024;  // Gloo's full mesh grows as N^2: simulated only up to this many ranks
  int64_t fact_bytes = 1300;   // one rank's encoded environment facts (21 MB at 16k ranks, issue 26)
};

// Throws Error{kComm} when a phase fails (e.g. a timeout) and Error{kEnvironment} when the
// process cannot hold `ranks` connections.
std::vector<ControlPlanePhase> bench_control_plane(const ControlPlaneOptions& options);

}  // namespace dstrain::comm
