#pragma once
// A plain connection to the run's rendezvous store (c10d TCPStore) for small control values:
// heartbeats, node liveness, the abort flag. Torch-free header; c10d stays in the .cpp.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dstrain::comm {

class StoreClient {
 public:
  // Connects to host:port, retrying up to `timeout`; throws Error{kComm} naming the address.
  StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(StoreClient&&) noexcept;
  // Each throws Error{kComm} when the store cannot be reached (its host is gone). Values are
  // signed with the job's secret and verified when read (store_auth.h): a value that does not
  // verify, or is over max_bytes, reads as not set.
  void set(const std::string& key, const std::string& value);
  std::optional<std::string> try_get(const std::string& key, size_t max_bytes = size_t{1} << 20);  // nullopt: not set
  // Several keys in two round trips (check, then one multi-get) when all are set, instead of two
  // per key: node 0's liveness pass over every rank's heartbeat (issue 26). Missing keys (while
  // ranks start) fall back to one try_get each.
  std::vector<std::optional<std::string>> try_get_many(const std::vector<std::string>& keys, size_t max_bytes = size_t{1} << 20);
  int64_t add(const std::string& key, int64_t delta);

  struct Impl;
  explicit StoreClient(std::unique_ptr<Impl> impl);  // wraps a store this process already holds

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::comm
