#include "dstrain/bench/liveness_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/core/progress.h"
#include "dstrain/launch/group_watch.h"
#include "dstrain/run/store_keys.h"

namespace dstrain::launch {

LivenessPass bench_liveness_pass(int nodes, int ranks_per_node, int passes) {
  const std::string run_key = "liveness-bench/0";
  comm::StoreServer server("127.0.0.1", 0, run_key, std::chrono::seconds(60));
  comm::StoreClient writer = server.client();
  LivenessPass out;
  for (int k = 1; k < nodes; ++k) {  // node 0's own beat comes from its GroupWatch
    NodeBeat b{1, "host-" + std::to_string(k), NodeState::kRunning, {}};
    progress::Snapshot s;
    s.step = 1200, s.phase = progress::Phase::kCollective, s.op = "all_reduce", s.seq = 48213, s.phase_s = 0.02;
    for (int i = 0; i < ranks_per_node; ++i)
      b.workers.push_back({k * ranks_per_node + i, 0.4, progress::encode(s, 977, b.host, 1764556800.0)});
    const std::string value = encode_node_beat(b);
    out.bytes += static_cast<int64_t>(value.size());
    writer.set(run::store_key(run_key, "node/" + std::to_string(k)), value);
  }
  GroupWatchOptions o;
  o.store_run_key = run_key;
  o.nnodes = nodes;
  o.world_size = nodes * ranks_per_node;
  o.heartbeat_timeout_s = 3600;  // the pass thread's own passes are 10 s apart: the timed ones are ours
  o.collective_timeout_s = 3600;
  GroupWatch watch([&server] { return std::make_unique<comm::StoreClient>(server.client()); }, o);
  std::vector<double> seconds;
  for (int i = 0; i < passes; ++i) {
    const auto start = std::chrono::steady_clock::now();
    watch.pass();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  out.seconds = seconds[seconds.size() / 2];
  out.keys = nodes;  // and one counter read
  return out;
}

}  // namespace dstrain::launch
