#pragma once
// `dstrain bench control-plane` (issue 26): the control plane of a large job simulated in one
// process. Fake ranks are threads that run dstrain's real rendezvous (join_store) against the
// real store server; node 0's liveness pass reads every rank's signed heartbeat through the real
// StoreClient, both the old way (a check and a get per rank) and batched (try_get_many). One
// process holds two descriptors per fake rank, so the open-files hard limit bounds N.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::comm {

struct ControlPlanePhase {
  std::string name;  // "rendezvous", "heartbeat pass (per key)", "heartbeat pass (batched)"
  double seconds = 0;
  int64_t operations = 0;  // store requests the phase made, as counted by the caller's protocol
};

// Throws Error{kComm} when a phase fails (e.g. a timeout) and Error{kEnvironment} when the
// process cannot hold `ranks` connections.
std::vector<ControlPlanePhase> bench_control_plane(int ranks, std::chrono::seconds timeout);

}  // namespace dstrain::comm
