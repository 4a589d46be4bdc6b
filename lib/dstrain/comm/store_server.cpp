// The launcher's side of the rendezvous: a c10d TCPStore server.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dstrain/comm/store_server.h"

#include "dstrain/comm/store_auth.h"
#include "dstrain/comm/store_client_impl.h"
#include "dstrain/core/error.h"

namespace dstrain::comm {

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(const std::string& host, int port, const std::string& run_id, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  try {
    impl_->store = open_tcp_store(host, port, timeout, /*is_server=*/true);
    const std::string value = run_id;
    impl_->store->set("dstrain/run", std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    // c10d's message carries a C++ backtrace after its first line: the user needs the first line.
    throw Error(ErrorCode::kComm, "cannot host the rendezvous store on " + host + ":" + std::to_string(port) + ": " + first_line(e.what()),
                port == 0 ? "check the address is local to this machine"
                          : "the port may be in use: choose another with --master-port, or 0 for a free one");
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return impl_->store->getPort(); }

StoreClient StoreServer::client() const {
  auto impl = std::make_unique<StoreClient::Impl>();
  impl->store = impl_->store;
  impl->where = "hosted here";
  return StoreClient(std::move(impl));
}

void StoreServer::publish(const std::string& key, const std::string& value) {
  const std::string stored = sign_store_value("dstrain/published/" + key, value);
  impl_->store->set("dstrain/published/" + key, std::vector<uint8_t>(stored.begin(), stored.end()));
}

NodeZeroInfo fetch_from_node_zero(const std::string& host, int port, const std::string& key, std::chrono::milliseconds timeout) {
  const std::string where = host + ":" + std::to_string(port);
  try {
    auto store = open_tcp_store(host, port, timeout, /*is_server=*/false);
    auto run = store->get("dstrain/run");
    auto value = store->get("dstrain/published/" + key);
    const auto verified = verify_store_value("dstrain/published/" + key, std::string(value.begin(), value.end()), size_t{64} << 20);
    if (!verified)
      throw Error(ErrorCode::kComm, "the " + key + " served at " + where + " is not signed with this node's " + kSecretVariable,
                  "give every node the same secret (the variable or DSTRAIN_STORE_SECRET_FILE); if they have it, another program is "
                  "serving that port");
    return {std::string(run.begin(), run.end()), *verified};
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(
        ErrorCode::kComm,
        "cannot reach node 0's launcher at " + where + " within " + std::to_string(timeout.count() / 1000) + " s: " + first_line(e.what()),
        "start node 0 first (or together), with the same --master-addr/--master-port; check the network between the nodes");
  }
}

}  // namespace dstrain::comm
