#pragma once
// The launchers' control plane for one restart generation, kept in node 0's store:
//   node/<k>    each node launcher's heartbeat ("<count> <host> running|stopped"), followed by a
//               line per worker of that node: its latest heartbeat and how long ago it changed
//   failed/<k>  a node's report of its own worker's failure (node 0 reads these when the
//               `failures` counter, which each report adds to, moves)
//   decision    node 0's order to every node: stop now, then "restart" or "final"
//   hb/<rank>   every worker's heartbeat (train/heartbeat.h), read by its own node's launcher
// Liveness is hierarchical (issue 26): each node's launcher reads its own workers' heartbeats and
// passes them on in its beat; node 0 reads the node keys (and failure reports) in one batched
// request per pass, on a thread of its own, so that at 16k ranks the supervisor never waits on
// the store and node 0 reads N/ranks-per-node keys, not N.
// poll() runs in the supervisor's watchdog on every node: node 0 reports hangs, lost nodes and
// other nodes' failures that its pass found; the other nodes follow node 0's decision, or stop
// when node 0 is lost.
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dstrain/launch/hang_watch.h"
#include "dstrain/launch/supervisor.h"

namespace dstrain::comm {
class StoreClient;
}

namespace dstrain::launch {

struct GroupWatchOptions {
  std::string store_run_key;  // run id / generation
  int node_rank = 0;
  int nnodes = 1;
  int world_size = 1;
  std::vector<int> local_ranks;  // this node's workers
  std::string master;            // "addr:port", for messages
  double heartbeat_timeout_s = 60;
  double collective_timeout_s = 600;
};

// What node 0 decided after a failure.
struct Decision {
  bool restart = false;
  bool resume = false;  // from the latest committed checkpoint
  std::string reason;
};

// A node launcher's beat: a counter that changes with every beat, its host, whether its
// workers still run, and what it last saw of each of its workers.
enum class NodeState { kRunning, kStopped };
struct WorkerSeen {
  int rank = 0;
  double age_s = 0;       // since its heartbeat last changed, on the node's clock
  std::string heartbeat;  // the raw value (progress::encode)
};
struct NodeBeat {
  uint64_t count = 0;
  std::string host;
  NodeState state = NodeState::kRunning;
  std::vector<WorkerSeen> workers;
};

class GroupWatch {
 public:
  // `connect` opens a store client: one for the supervisor's thread and, on node 0, one for the
  // liveness pass's thread.
  using Connect = std::function<std::unique_ptr<comm::StoreClient>()>;
  GroupWatch(const Connect& connect, GroupWatchOptions options);
  ~GroupWatch();

  // The supervisor's watchdog: reads this node's workers' heartbeats and sends this node's beat;
  // returns what went wrong (on node 0: what the last pass found).
  std::optional<launch::WorkerFailure> poll();
  // Node 0: one liveness pass now (the pass thread runs one every heartbeat period); its finding
  // is returned by the next poll(). Public for `dstrain bench control-plane`.
  void pass();
  // Where every rank is (node 0; empty elsewhere): for the report after any failure.
  std::string positions() const;

  // Node > 0: tell node 0 about this node's worker failure.
  void report_failure(const launch::WorkerFailure& failure);
  // Node 0 after a failure: the other nodes' own failure reports, waiting up to `wait_s` for
  // every node to report or say it stopped (a local comm error is often the echo of a worker
  // that died on another node a moment earlier: the earliest failure is the root cause).
  std::vector<launch::WorkerFailure> gather_reports(double wait_s);
  // Node 0: the nodes whose launchers went silent (a restart cannot include them).
  std::vector<int> lost_nodes();
  // Node 0: tell every node to stop, and what comes next; then wait (up to the heartbeat
  // timeout) until every node says its workers have stopped.
  void decide(const Decision& decision);
  // Node > 0: this node's workers have stopped; wait for node 0's decision (nullopt: node 0 gone).
  std::optional<Decision> await_decision();

 private:
  std::string key(const std::string& name) const;
  void read_local_workers();
  void beat(NodeState state);
  bool stopped_or_gone(int k);  // never joined, stopped its workers, or silent
  std::optional<launch::WorkerFailure> judge(const std::vector<std::optional<std::string>>& values, double now_s);
  std::optional<launch::WorkerFailure> report_of(int node);
  // Node's failure report `value`, once: marks it handed out (under mu_).
  std::optional<launch::WorkerFailure> take_report(int node, const std::optional<std::string>& value);
  struct Node;
  void note_node(int k, const std::optional<std::string>& value, double now_s);  // under mu_
  Node refresh_node(int k, double now_s);
  bool handed_out(int k) const;  // node k's failure report went to the supervisor already
  bool node_silent(int k, double now_s);
  double now() const;
  void pass_loop();

  std::unique_ptr<comm::StoreClient> store_;  // the supervisor's thread
  GroupWatchOptions o_;
  launch::HangWatch local_;                // this node's workers, as read from the store
  std::vector<std::string> local_keys_;    // their heartbeat keys
  std::vector<std::string> local_values_;  // their latest raw heartbeats ("" before the first)
  uint64_t beats_ = 0;
  double last_contact_s_;
  std::string host_;
  struct Node {
    std::string last;  // the raw value: any change is a sign of life
    NodeBeat beat;
    double last_change_s = 0;
    bool seen = false;
  };
  // Node 0's view, shared by the pass thread and the supervisor's thread.
  mutable std::mutex mu_;
  launch::HangWatch hangs_;
  std::vector<Node> nodes_;
  std::vector<bool> taken_;                     // nodes whose failure report was handed out
  std::optional<launch::WorkerFailure> found_;  // the pass's finding, until poll() hands it out
  // Node 0's pass thread and its own store client.
  std::unique_ptr<comm::StoreClient> pass_store_;
  std::vector<std::string> pass_keys_;  // node/0..N-1
  int64_t reports_read_ = 0;            // the "failures" count at the last read of the reports
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread pass_thread_;
};

// The store values, and back (exposed for tests): failed/<k>, node/<k> ("<count> <host>
// running|stopped", then "<rank> <age_ms> <heartbeat>" per worker) and decision
// ("restart|final resume|fresh\n<reason>").
std::string encode_failure(const launch::WorkerFailure& f);
launch::WorkerFailure decode_failure(const std::string& text);
std::string encode_node_beat(const NodeBeat& beat);
std::optional<NodeBeat> decode_node_beat(const std::string& text);
std::string encode_decision(const Decision& decision);
std::optional<Decision> decode_decision(const std::string& text);

}  // namespace dstrain::launch
