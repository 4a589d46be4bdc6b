#include "dstrain/bench/control_plane_bench.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "dstrain/comm/rendezvous.h"
#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_gather.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/core/error.h"
#include "dstrain/run/store_keys.h"

namespace dstrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using Stores = std::vector<c10::intrusive_ptr<c10d::Store>>;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr int64_t kGlooRankInfoBytes = 154;  // hostname, device address and sizes: what a Gloo rank publishes, pair ids aside
constexpr int kGlooKeysPerRequest = 128;     // Gloo's multi_get batch

void check_descriptors(int ranks) {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  const rlim_t needed = static_cast<rlim_t>(ranks) + 256;  // a client socket per fake rank (the server's are the child's)
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < needed)
    throw Error(ErrorCode::kEnvironment,
                "simulating " + std::to_string(ranks) + " ranks in one process needs " + std::to_string(needed) +
                    " open files; the limit is " + std::to_string(r.rlim_cur),
                "use fewer --ranks, or raise the hard limit (ulimit -Hn)");
}

// The store server in a child process, as node 0's launcher is: this process then holds one
// descriptor per fake rank instead of two, so 16k ranks fit a 20,000 open-files limit.
class ForkedStore {
 public:
  ForkedStore(const std::string& run_id, std::chrono::milliseconds timeout) {
    int port_pipe[2], stop_pipe[2];
    if (::pipe(port_pipe) != 0 || ::pipe(stop_pipe) != 0) throw Error(ErrorCode::kEnvironment, "pipe() failed", "");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(port_pipe[0]), ::close(stop_pipe[1]);
      try {
        StoreServer server("127.0.0.1", 0, run_id, timeout);
        const int port = server.port();
        if (::write(port_pipe[1], &port, sizeof(port)) == sizeof(port)) {
          char c;
          while (::read(stop_pipe[0], &c, 1) > 0) {}  // until the parent closes its end (or dies)
        }
      } catch (...) {}
      ::_exit(0);
    }
    ::close(port_pipe[1]), ::close(stop_pipe[0]);
    stop_fd_ = stop_pipe[1];
    const bool got = pid_ > 0 && ::read(port_pipe[0], &port_, sizeof(port_)) == sizeof(port_);
    ::close(port_pipe[0]);
    if (!got) {
      this->~ForkedStore();
      throw Error(ErrorCode::kEnvironment, "the store server's process did not start", "check that 127.0.0.1 has a free port");
    }
  }
  ~ForkedStore() {
    if (stop_fd_ >= 0) ::close(stop_fd_), stop_fd_ = -1;
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0), pid_ = -1;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int stop_fd_ = -1, port_ = 0;
};

// Runs fn(rank) on one thread per fake rank; returns the seconds until all ended and rethrows
// the first failure.
double on_every_rank(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto start = Clock::now();
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
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

// The peers a rank's first barrier, broadcast and ring collectives connect to: r +- 2^k.
std::set<int> lazy_peers(int rank, int ranks) {
  std::set<int> peers;
  for (int step = 1; step < ranks; step *= 2) {
    peers.insert((rank + step) % ranks);
    peers.insert(((rank - step) % ranks + ranks) % ranks);
  }
  peers.erase(rank);
  return peers;
}

// Gloo's setup traffic on the store, as gloo/transport/tcp/context.cc drives it.
ControlPlanePhase gloo_setup(const Stores& stores, const std::string& prefix, bool lazy) {
  const int ranks = static_cast<int>(stores.size());
  const int64_t value_bytes = kGlooRankInfoBytes + (lazy ? 0 : 8 * static_cast<int64_t>(ranks));
  std::atomic<int64_t> requests{0}, bytes{0};
  ControlPlanePhase out{lazy ? "gloo setup (lazy pairs)" : "gloo setup (full mesh)"};
  out.seconds = on_every_rank(ranks, [&](int r) {
    c10d::Store& store = *stores[static_cast<size_t>(r)];
    store.set(prefix + std::to_string(r), std::vector<uint8_t>(static_cast<size_t>(value_bytes), 'g'));
    int64_t n = 1, got = 0;
    if (lazy) {
      for (int peer : lazy_peers(r, ranks)) got += static_cast<int64_t>(store.get(prefix + std::to_string(peer)).size()), ++n;
    } else {
      std::vector<std::string> keys;
      for (int k = 0; k < ranks; ++k) keys.push_back(prefix + std::to_string(k));
      store.wait(keys);
      for (size_t first = 0; first < keys.size(); first += kGlooKeysPerRequest, ++n) {
        const size_t last = std::min(keys.size(), first + kGlooKeysPerRequest);
        for (const auto& v : store.multiGet(std::vector<std::string>(keys.begin() + first, keys.begin() + last)))
          got += static_cast<int64_t>(v.size());
      }
      ++n;
    }
    requests += n, bytes += got;
  });
  out.operations = requests, out.bytes = bytes;
  return out;
}

ControlPlanePhase gather_facts(const Stores& stores, const std::string& run_id, int64_t fact_bytes, std::chrono::milliseconds timeout) {
  const int ranks = static_cast<int>(stores.size());
  const std::string facts(static_cast<size_t>(fact_bytes), 'f');
  std::atomic<int64_t> at_root{0};
  ControlPlanePhase out{"env check facts to rank 0 (gather)"};
  out.seconds = on_every_rank(ranks, [&](int r) {
    const StoreGather g{stores[static_cast<size_t>(r)].get(), "dstrain/" + run_id + "/gather/", r, ranks, timeout};
    for (const auto& f : store_gather_bytes(g, 1, facts, 0)) at_root += static_cast<int64_t>(f.size());
  });
  // Each rank: a set, a wait and a delete; rank 0: a wait, its multiGets and the done flag.
  out.operations = 3 * static_cast<int64_t>(ranks - 1) + 2 + (ranks + 1023) / 1024;
  out.bytes = at_root - fact_bytes;  // what crossed the store into rank 0
  return out;
}

}  // namespace

std::vector<ControlPlanePhase> bench_control_plane(const ControlPlaneOptions& o) {
  const int ranks = o.ranks;
  check_descriptors(ranks);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(o.timeout);
  const std::string run_id = "control-plane-bench";
  ForkedStore server(run_id, ms);
  Endpoint ep{"127.0.0.1", server.port(), run_id, ms, false, ms};
  ep.publish_run_id = false;
  std::vector<ControlPlanePhase> out;
  // Each rank: connect, check the run id, announce itself, add to the count, wait for the gate.
  Stores stores(static_cast<size_t>(ranks));
  out.push_back({"rendezvous", on_every_rank(ranks, [&](int r) { stores[static_cast<size_t>(r)] = join_store(ep, r, ranks); }),
                 static_cast<int64_t>(ranks) * 5, 0});
  if (ranks > 1) {
    out.push_back(gloo_setup(stores, "dstrain/" + run_id + "/gloo-lazy/", true));
    if (ranks <= o.full_mesh_up_to) out.push_back(gloo_setup(stores, "dstrain/" + run_id + "/gloo-mesh/", false));
    out.push_back(gather_facts(stores, run_id, o.fact_bytes, ms));
    // The all-gather it replaces moved every rank's facts into every rank.
    out.push_back({"env check facts all-gathered (before; not run)", 0, 0, static_cast<int64_t>(ranks) * (ranks - 1) * o.fact_bytes});
  }

  StoreClient node0("127.0.0.1", server.port(), ms);
  std::vector<std::string> keys;
  for (int r = 0; r < ranks; ++r) {
    keys.push_back(run::heartbeat_key(run_id, r));
    node0.set(keys.back(), "v1 1 1 forward - 0 12 host-" + std::to_string(r / 8) + " 1764556800");
  }
  auto start = Clock::now();
  int64_t seen = 0;
  for (const auto& key : keys) seen += node0.try_get(key).has_value();
  out.push_back({"heartbeat pass (per key)", seconds_since(start), static_cast<int64_t>(ranks) * 2, 0});
  start = Clock::now();
  const auto beats = node0.try_get_many(keys);
  out.push_back({"heartbeat pass (batched)", seconds_since(start), 2, 0});
  for (const auto& b : beats) seen -= b.has_value();
  if (seen != 0) throw Error(ErrorCode::kInternal, "the batched heartbeat read disagrees with the per-key one", "");
  return out;
}

}  // namespace dstrain::comm
