#include "dstrain/run/store_keys.h"

#include <algorithm>
#include <cstdint>

namespace dstrain::run {

std::string store_key(const std::string& store_run_key, const std::string& name) { return "dstrain/" + store_run_key + "/" + name; }

std::string heartbeat_key(const std::string& store_run_key, int rank) { return store_key(store_run_key, "hb/" + std::to_string(rank)); }

std::chrono::milliseconds heartbeat_period(double heartbeat_timeout_s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(heartbeat_timeout_s / 6.0, 0.1, 10.0) * 1000));
}

}  // namespace dstrain::run
