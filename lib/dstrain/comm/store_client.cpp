#include "dstrain/comm/store_client.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "dstrain/comm/store_auth.h"
#include "dstrain/comm/store_client_impl.h"
#include "dstrain/core/error.h"

namespace dstrain::comm {
namespace {

[[noreturn]] void unreachable(const std::string& where, const std::exception& e) {
  throw Error(ErrorCode::kComm, "the rendezvous store " + where + " cannot be reached: " + first_line(e.what()),
              "node 0's launcher may be gone; check its log and the network");
}

}  // namespace

// A listening socket on host:port only (port 0: a free one), never the wildcard address unless
// DSTRAIN_STORE_BIND asks for it (e.g. 0.0.0.0 behind NAT); the store takes it over.
int listen_socket(const std::string& host, int& port) {
  const char* bind_env = std::getenv("DSTRAIN_STORE_BIND");
  const std::string bind_host = bind_env && *bind_env ? bind_env : host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(bind_host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    throw std::runtime_error("cannot resolve " + bind_host + ": " + ::gai_strerror(rc));
  int fd = -1, err = 0;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 4096) != 0) err = errno, ::close(fd), fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0)
    throw std::runtime_error("cannot listen on " + bind_host + ":" + std::to_string(port) + ": " + std::strerror(err) +
                             (err == EADDRNOTAVAIL ? " (not an address of this machine; set --master-addr to one)" : ""));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  port = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  return fd;
}

c10::intrusive_ptr<c10d::TCPStore> open_tcp_store(const std::string& host, int port, std::chrono::milliseconds timeout, bool is_server) {
  c10d::TCPStoreOptions opts;
  if (is_server) opts.masterListenFd = listen_socket(host, port);
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
    const std::string stored = sign_store_value(key, value);
    impl_->store->set(key, std::vector<uint8_t>(stored.begin(), stored.end()));
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

std::optional<std::string> StoreClient::try_get(const std::string& key, size_t max_bytes) {
  try {
    if (!impl_->store->check({key})) return std::nullopt;
    const std::vector<uint8_t> v = impl_->store->get(key);
    return verify_store_value(key, std::string(v.begin(), v.end()), max_bytes);
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

std::vector<std::optional<std::string>> StoreClient::try_get_many(const std::vector<std::string>& keys, size_t max_bytes) {
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  try {
    if (!keys.empty() && impl_->store->check(keys)) {
      const std::vector<std::vector<uint8_t>> values = impl_->store->multiGet(keys);
      for (size_t i = 0; i < keys.size(); ++i)
        out.push_back(verify_store_value(keys[i], std::string(values[i].begin(), values[i].end()), max_bytes));
      return out;
    }
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
  for (const auto& key : keys) out.push_back(try_get(key, max_bytes));
  return out;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    unreachable(impl_->where, e);
  }
}

}  // namespace dstrain::comm
