#pragma once
// A worker's heartbeat: a thread that puts this rank's progress (core/progress.h) into the run's
// store every `period`, under heartbeat_key(). It runs independently of the training loop, so it
// stops only when the whole process is frozen (SIGSTOP, a stuck kernel) or gone; the launcher's
// HangWatch tells those apart from a collective that waits too long.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dstrain/run/store_keys.h"
#include "dstrain/run/worker_env.h"

namespace dstrain::comm {
class StoreClient;
}

namespace dstrain::train {

class HeartbeatSender {
 public:
  HeartbeatSender(const run::WorkerEnv& env, double heartbeat_timeout_s);
  ~HeartbeatSender();  // sends a last beat (the current phase: "finished" after a clean end)

 private:
  void beat();
  void loop();
  std::unique_ptr<comm::StoreClient> store_;
  std::string key_, host_;
  std::chrono::milliseconds period_;
  uint64_t count_ = 0;
  bool broken_ = false;  // the store is gone: stop trying (the launcher is gone too)
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dstrain::train
