#pragma once
// The rendezvous store, hosted by the launcher of node 0 for the lifetime of the run (c10d
// TCPStore). A separate header from communicator.h so the launcher does not see ATen.
#include <chrono>
#include <memory>
#include <string>

#include "dstrain/comm/store_client.h"

namespace dstrain::comm {

// The rendezvous store, hosted by the launcher of node 0 for the lifetime of the run.
class StoreServer {
 public:
  // port 0 picks a free port; port() tells which.
  StoreServer(const std::string& host, int port, const std::string& run_id, std::chrono::milliseconds timeout);
  ~StoreServer();
  int port() const;
  // Publishes a value for the launchers of the other nodes (e.g. the resolved config).
  void publish(const std::string& key, const std::string& value);
  // A client of this store, in this process (heartbeats, node liveness, the abort flag).
  StoreClient client() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a launcher of node > 0 learns from node 0's store: the run key (run id and generation)
// and a published value. Waits up to `timeout` for node 0; the error names the address.
struct NodeZeroInfo {
  std::string run_key;
  std::string value;
};
NodeZeroInfo fetch_from_node_zero(const std::string& host, int port, const std::string& key, std::chrono::milliseconds timeout);

}  // namespace dstrain::comm
