#include "dstrain/comm/store_client.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dstrain/comm/store_client_impl.h"
#include "dstrain/core/error.h"

namespace dstrain::comm {
namespace {

[[noreturn]] void unreachable(const std::string& where, const std::exception& e) {
  throw Error(ErrorCode::kComm, "the rendezvous store " + where + " cannot be reached: " + first_line(e.what()),
              "node 0's launcher may be gone; check its log and the network");
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> open_tcp_store(const std::string& host, int port, std::chrono::milliseconds timeout, bool is_server) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = is_server;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

StoreClient::StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  impl_->where = "at " + host + ":" + std::to_string(port);
  try {
    impl_->store = open_tcp_store(host, port, timeout, /*is_server=*/false);
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;
StoreClient::StoreClient(StoreClient&&) noexcept = default;

void StoreClient::set(const std::string& key, const std::string& value) {
  try {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

std::optional<std::string> StoreClient::try_get(const std::string& key) {
  try {
    if (!impl_->store->check({key})) return std::nullopt;
    const std::vector<uint8_t> v = impl_->store->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

}  // namespace dstrain::comm
