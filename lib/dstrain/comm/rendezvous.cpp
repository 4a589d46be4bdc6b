#include "dstrain/comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dstrain/comm/store_client_impl.h"
#include "dstrain/core/host.h"
#include "dstrain/core/error.h"
#include "dstrain/run/worker_env.h"

namespace dstrain::comm {
namespace {

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string seconds(std::chrono::milliseconds ms) { return std::to_string(ms.count() / 1000) + " s"; }

}  // namespace

std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {  // UDP connect: sends nothing
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)))
      out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

Endpoint endpoint_of(const run::WorkerEnv& env, std::chrono::milliseconds timeout, std::chrono::milliseconds collective_timeout) {
  Endpoint ep{env.master_addr, env.master_port, run::store_run_key(env), timeout, env.host_store, collective_timeout};
  ep.publish_run_id = env.publish_run_id;
  return ep;
}

c10::intrusive_ptr<c10d::Store> join_store(const Endpoint& ep, int rank, int world) {
  const std::string where = ep.master_addr + ":" + std::to_string(ep.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = open_tcp_store(ep.master_addr, ep.master_port, ep.timeout, ep.host_store);
    // Without a dstrain launcher nobody else names the run: rank 0 does, unless the store holds a
    // name already (a launcher's, or another job's, which the check below refuses).
    if (ep.host_store || ep.publish_run_id) store->compareSet("dstrain/run", {}, bytes(ep.run_id));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(rank) + " cannot " + (ep.host_store ? "host" : "reach") + " the rendezvous store at " + where +
                    ": " + first_line(e.what()),
                ep.host_store ? "the port may be in use: choose another MASTER_PORT"
                              : "check MASTER_ADDR/MASTER_PORT, that node 0's launcher runs, and that no firewall blocks the port");
  }
  std::string served;
  try {
    served = text(store->get("dstrain/run"));
  } catch (const std::exception&) {
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(rank) + ": the store at " + where + " never published a run id within " + seconds(ep.timeout),
                "is another program listening on that port? Start the run with `dstrain train`");
  }
  if (served != ep.run_id)
    throw Error(
        ErrorCode::kComm,
        "rank " + std::to_string(rank) + " belongs to run '" + ep.run_id + "' but the store at " + where + " serves run '" + served + "'",
        "this worker is from another job or an older restart generation; stop it and start the run again");

  // Announce, then wait for everyone, so that a missing rank is named instead of hanging in Gloo.
  const std::string prefix = "dstrain/" + ep.run_id + "/arrived/";
  store->set(prefix + std::to_string(rank), bytes(host_name()));
  // The last to arrive opens the gate; the others wait on its key (one blocking request each,
  // not a poll every 20 ms: at 16k ranks polling alone saturated the store, issue 26).
  if (store->add(prefix + "count", 1) >= world) store->set(prefix + "all", bytes("1"));
  try {
    store->wait({prefix + "all"}, std::chrono::duration_cast<std::chrono::milliseconds>(ep.timeout));
  } catch (const std::exception&) {
    std::string missing, arrived;
    int n_missing = 0;
    for (int r = 0; r < world; ++r) {
      if (store->check({prefix + std::to_string(r)})) {
        if (arrived.size() < 200)
          arrived += (arrived.empty() ? "" : ", ") + std::to_string(r) + "@" + text(store->get(prefix + std::to_string(r)));
      } else if (++n_missing <= 32) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw Error(ErrorCode::kComm,
                std::to_string(n_missing) + " of " + std::to_string(world) + " ranks never arrived within " + seconds(ep.timeout) +
                    ": rank" + (n_missing == 1 ? " " : "s ") + missing + (n_missing > 32 ? ", ..." : "") + " (arrived: " + arrived + ")",
                "check that every node's launcher was started with the same --master-addr/--master-port and --nnodes, and their logs");
  }
  return store;
}

}  // namespace dstrain::comm
