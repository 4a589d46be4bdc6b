#pragma once
// Joining the run's c10d TCPStore. Internal to comm/: only the c10d translation units
// (gloo_communicator.cpp, rendezvous.cpp) use it; c10d itself stays out of this header.
#include <c10/util/intrusive_ptr.h>

#include <string>

#include "dstrain/comm/communicator.h"

namespace c10d {
class Store;
}

namespace dstrain::comm {

// The local IP address this host uses to reach `master_addr` (Gloo binds to it, so that nodes
// in other network namespaces or behind other routes can connect back).
std::string local_address_towards(const std::string& master_addr);

// Connects to (or, with ep.host_store, hosts) the store, checks the run id, announces `rank`
// and waits until all `world` ranks have; a timeout names the ranks that never arrived.
c10::intrusive_ptr<c10d::Store> join_store(const Endpoint& ep, int rank, int world);

}  // namespace dstrain::comm
