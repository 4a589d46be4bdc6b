#pragma once
// StoreClient's insides, shared by the c10d translation units (store_client.cpp, store_server.cpp);
// c10d itself stays out of this header, as in rendezvous.h.
#include <c10/util/intrusive_ptr.h>

#include <string>

#include "dstrain/comm/store_client.h"

namespace c10d {
class Store;
class TCPStore;
}  // namespace c10d

namespace dstrain::comm {

// A TCPStore at host:port: the server (is_server) or a client; c10d's exceptions pass through.
c10::intrusive_ptr<c10d::TCPStore> open_tcp_store(const std::string& host, int port, std::chrono::milliseconds timeout, bool is_server);

struct StoreClient::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  std::string where;
};

}  // namespace dstrain::comm
