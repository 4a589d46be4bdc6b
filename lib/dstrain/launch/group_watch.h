#pragma once
// The launchers' control plane for one restart generation, kept in node 0's store:
//   node/<k>    each node launcher's heartbeat ("<count> <host> running|stopped")
//   failed/<k>  a node's report of its own worker's failure (node 0 reads these)
//   decision    node 0's order to every node: stop now, then "restart" or "final"
//   hb/<rank>   every worker's heartbeat (train/heartbeat.h), read by node 0's HangWatch
// poll() runs in the supervisor's watchdog on every node: node 0 spots hangs, lost nodes and
// other nodes' failures; the other nodes follow node 0's decision, or stop when node 0 is lost.
#include <memory>
#include <optional>
#include <string>
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
  std::string master;  // "addr:port", for messages
  double heartbeat_timeout_s = 60;
  double collective_timeout_s = 600;
};

// What node 0 decided after a failure.
struct Decision {
  bool restart = false;
  bool resume = false;  // from the latest committed checkpoint
  std::string reason;
};

// A node launcher's beat: a counter that changes with every beat, its host, and whether its
// workers still run.
enum class NodeState { kRunning, kStopped };
struct NodeBeat {
  uint64_t count = 0;
  std::string host;
  NodeState state = NodeState::kRunning;
};

class GroupWatch {
 public:
  GroupWatch(std::unique_ptr<comm::StoreClient> store, GroupWatchOptions options);
  ~GroupWatch();

  // The supervisor's watchdog. Also sends this node's heartbeat.
  std::optional<launch::WorkerFailure> poll();
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
  void beat(NodeState state);
  bool stopped_or_gone(int k);  // never joined, stopped its workers, or silent
  std::optional<launch::WorkerFailure> poll_as_node_zero(double now_s, launch::WorkerFailure f);
  std::optional<launch::WorkerFailure> report_of(int node);
  struct Node;
  const Node& refresh_node(int k, double now_s);
  bool node_silent(int k, double now_s);
  double now() const;
  std::unique_ptr<comm::StoreClient> store_;
  GroupWatchOptions o_;
  launch::HangWatch hangs_;
  std::vector<std::string> heartbeat_keys_;  // every rank's, built once
  uint64_t beats_ = 0;
  double last_contact_s_;
  struct Node {
    std::string last;  // the raw value: any change is a sign of life
    NodeBeat beat;
    double last_change_s = 0;
    bool seen = false;
  };
  std::vector<Node> nodes_;
  std::vector<bool> taken_;  // nodes whose failure report was handed out
  std::string host_;
};

// The store values, and back (exposed for tests): failed/<k>, node/<k> ("<count> <host>
// running|stopped") and decision ("restart|final resume|fresh\n<reason>").
std::string encode_failure(const launch::WorkerFailure& f);
launch::WorkerFailure decode_failure(const std::string& text);
std::string encode_node_beat(const NodeBeat& beat);
std::optional<NodeBeat> decode_node_beat(const std::string& text);
std::string encode_decision(const Decision& decision);
std::optional<Decision> decode_decision(const std::string& text);

}  // namespace dstrain::launch
