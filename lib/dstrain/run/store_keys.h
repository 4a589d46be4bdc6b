#pragma once
// The rendezvous store's keys, all under "dstrain/<run id>/<restart generation>/":
//   hb/<rank>    a worker's heartbeat (train/heartbeat.h; core/progress.h encodes it)
//   node/<k>     node k's launcher beat, failed/<k> its failure report, decision node 0's order
//                (launch/group_watch.h)
#include <chrono>
#include <string>

namespace dstrain::run {

// "dstrain/<store run key>/<name>".
std::string store_key(const std::string& store_run_key, const std::string& name);
std::string heartbeat_key(const std::string& store_run_key, int rank);
// Heartbeat period for a timeout: a sixth of it, within [0.1 s, 10 s].
std::chrono::milliseconds heartbeat_period(double heartbeat_timeout_s);

}  // namespace dstrain::run
