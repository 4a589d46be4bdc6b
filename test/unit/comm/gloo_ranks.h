#pragma once
// Real Gloo groups in one test process: threads as ranks, one store server.
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_server.h"

namespace test {

// Runs fn(rank's Gloo communicator) on `world` threads; returns each rank's exception message ("" if none).
// `run_id` must be the one `server` was made with.
inline std::vector<std::string> on_gloo_ranks(int world, std::chrono::milliseconds timeout,
                                              const std::function<void(dstrain::comm::Communicator&)>& fn,
                                              dstrain::comm::StoreServer& server, const std::string& run_id) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        dstrain::comm::Endpoint ep{"127.0.0.1", server.port(), run_id, timeout, false, timeout};
        auto c = dstrain::comm::make_gloo_communicator(ep, r, world);
        fn(*c);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace test
