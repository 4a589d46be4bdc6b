#include "dstrain/train/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "dstrain/comm/store_client.h"
#include "dstrain/core/error.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/core/progress.h"

namespace dstrain::train {

HeartbeatSender::HeartbeatSender(const run::WorkerEnv& env, double heartbeat_timeout_s)
    : key_(run::heartbeat_key(run::store_run_key(env), env.rank)), period_(run::heartbeat_period(heartbeat_timeout_s)) {
  host_ = host_name();
  store_ = std::make_unique<comm::StoreClient>(env.master_addr, env.master_port,
                                               std::chrono::milliseconds(static_cast<int64_t>(heartbeat_timeout_s * 1000)));
  beat();
  thread_ = std::thread([this] { loop(); });
}

HeartbeatSender::~HeartbeatSender() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  beat();
}

void HeartbeatSender::beat() {
  if (broken_) return;
  try {
    store_->set(key_, progress::encode(progress::snapshot(), ++count_, host_, unix_seconds()));
  } catch (const Error& e) {
    broken_ = true;
    log::warn(std::string("heartbeats stopped: ") + e.what());
  }
}

void HeartbeatSender::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();
    beat();
    lock.lock();
  }
}

}  // namespace dstrain::train
