#include "dstrain/comm/control_plane_bench.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/resource.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "dstrain/comm/rendezvous.h"
#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/core/error.h"
#include "dstrain/run/store_keys.h"

namespace dstrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check_descriptors(int ranks) {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  const rlim_t needed = static_cast<rlim_t>(ranks) * 2 + 256;  // a client and a server socket per fake rank
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < needed)
    throw Error(ErrorCode::kEnvironment,
                "simulating " + std::to_string(ranks) + " ranks in one process needs " + std::to_string(needed) +
                    " open files; the limit is " + std::to_string(r.rlim_cur),
                "use fewer --ranks, or raise the hard limit (ulimit -Hn)");
}

// Every fake rank joins as a worker does; the stores stay open until all have joined.
double rendezvous(int ranks, const Endpoint& ep) {
  std::vector<c10::intrusive_ptr<c10d::Store>> stores(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto start = Clock::now();
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        stores[static_cast<size_t>(r)] = join_store(ep, r, ranks);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  const double seconds = seconds_since(start);
  if (failure) std::rethrow_exception(failure);
  return seconds;
}

}  // namespace

std::vector<ControlPlanePhase> bench_control_plane(int ranks, std::chrono::seconds timeout) {
  check_descriptors(ranks);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  const std::string run_id = "control-plane-bench";
  StoreServer server("127.0.0.1", 0, run_id, ms);
  Endpoint ep{"127.0.0.1", server.port(), run_id, ms, false, ms};
  ep.publish_run_id = false;
  std::vector<ControlPlanePhase> out;
  // Each rank: connect, check the run id, announce itself, add to the count, wait for the gate.
  out.push_back({"rendezvous", rendezvous(ranks, ep), static_cast<int64_t>(ranks) * 5});

  StoreClient node0 = server.client();
  std::vector<std::string> keys;
  for (int r = 0; r < ranks; ++r) {
    keys.push_back(run::heartbeat_key(run_id, r));
    node0.set(keys.back(), "v1 1 1 forward - 0 12 host-" + std::to_string(r / 8) + " 1764556800");
  }
  auto start = Clock::now();
  int64_t seen = 0;
  for (const auto& key : keys) seen += node0.try_get(key).has_value();
  out.push_back({"heartbeat pass (per key)", seconds_since(start), static_cast<int64_t>(ranks) * 2});
  start = Clock::now();
  const auto beats = node0.try_get_many(keys);
  out.push_back({"heartbeat pass (batched)", seconds_since(start), 2});
  for (const auto& b : beats) seen -= b.has_value();
  if (seen != 0) throw Error(ErrorCode::kInternal, "the batched heartbeat read disagrees with the per-key one", "");
  return out;
}

}  // namespace dstrain::comm
