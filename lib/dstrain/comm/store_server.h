#pragma once
// The rendezvous store, hosted by the launcher of node 0 for the lifetime of the run (c10d
// TCPStore). A separate header from communicator.h so the launcher does not see ATen.
#include <chrono>
#include <memory>
#include <string>

namespace dstrain::comm {

// The rendezvous store, hosted by the launcher of node 0 for the lifetime of the run.
class StoreServer {
 public:
  // port 0 picks a free port; port() tells which.
  StoreServer(const std::string& host, int port, const std::string& run_id, std::chrono::milliseconds timeout);
  ~StoreServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::comm
