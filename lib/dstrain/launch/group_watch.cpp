#include "dstrain/launch/group_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "dstrain/comm/store_client.h"
#include "dstrain/core/error.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/run/store_keys.h"

namespace dstrain::launch {

std::string encode_failure(const launch::WorkerFailure& f) {
  std::ostringstream out;
  out.precision(17);
  out << launch::failure_kind_name(f.kind) << '\n'
      << f.rank << '\n'
      << f.pid << '\n'
      << f.host << '\n'
      << f.exit_code << '\n'
      << f.signal << '\n'
      << f.unix_time << '\n'
      << f.description;
  for (const auto& line : f.tail) out << '\n' << line;
  return out.str();
}

launch::WorkerFailure decode_failure(const std::string& text) {
  launch::WorkerFailure f;
  std::istringstream in(text);
  std::string line;
  auto next = [&] { return std::getline(in, line) ? line : std::string(); };
  f.happened = true;
  try {
    if (!launch::parse_failure_kind(next(), f.kind)) throw std::invalid_argument("kind");
    f.rank = std::stoi(next());
    f.pid = std::stoi(next());
    f.host = next();
    f.exit_code = std::stoi(next());
    f.signal = std::stoi(next());
    f.unix_time = std::stod(next());
  } catch (const std::exception&) {
    f.description = "(an unreadable failure report)";
    return f;
  }
  f.description = next();
  while (std::getline(in, line)) f.tail.push_back(line);
  return f;
}

std::string encode_node_beat(const NodeBeat& b) {
  return fmt::format("{} {} {}", b.count, b.host, b.state == NodeState::kStopped ? "stopped" : "running");
}

std::optional<NodeBeat> decode_node_beat(const std::string& text) {
  std::istringstream in(text);
  NodeBeat b;
  std::string state;
  if (!(in >> b.count >> b.host >> state) || (state != "running" && state != "stopped")) return std::nullopt;
  b.state = state == "stopped" ? NodeState::kStopped : NodeState::kRunning;
  return b;
}

std::string encode_decision(const Decision& d) {
  return fmt::format("{} {}\n{}", d.restart ? "restart" : "final", d.resume ? "resume" : "fresh", d.reason);
}

std::optional<Decision> decode_decision(const std::string& text) {
  const auto newline = text.find('\n');
  std::istringstream head(text.substr(0, newline));
  std::string what, from;
  if (newline == std::string::npos || !(head >> what >> from) || (what != "restart" && what != "final") ||
      (from != "resume" && from != "fresh"))
    return std::nullopt;
  return Decision{what == "restart", from == "resume", text.substr(newline + 1)};
}

GroupWatch::GroupWatch(std::unique_ptr<comm::StoreClient> store, GroupWatchOptions options)
    : store_(std::move(store)), o_(std::move(options)), hangs_(o_.world_size, o_.heartbeat_timeout_s, o_.collective_timeout_s),
      nodes_(static_cast<size_t>(o_.nnodes)), taken_(static_cast<size_t>(o_.nnodes), false) {
  host_ = host_name();
  last_contact_s_ = now();
  beat(NodeState::kRunning);
}

GroupWatch::~GroupWatch() = default;

double GroupWatch::now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string GroupWatch::key(const std::string& name) const { return run::store_key(o_.store_run_key, name); }

void GroupWatch::beat(NodeState state) {
  try {
    store_->set(key("node/" + std::to_string(o_.node_rank)), encode_node_beat({++beats_, host_, state}));
    last_contact_s_ = now();
  } catch (const Error&) {
    // Counted below: only a silence longer than the heartbeat timeout means node 0 is gone.
  }
}

std::optional<launch::WorkerFailure> GroupWatch::poll() {
  beat(NodeState::kRunning);
  const double t = now();
  launch::WorkerFailure f;
  f.happened = true;
  f.unix_time = unix_seconds();
  if (o_.node_rank > 0) {
    if (t - last_contact_s_ > o_.heartbeat_timeout_s) {
      f.kind = launch::FailureKind::kNodeLost;
      f.description =
          fmt::format("lost node 0: its launcher's store at {} has not answered for {:.0f} s (launch.heartbeat_timeout_s = {:g})",
                      o_.master, t - last_contact_s_, o_.heartbeat_timeout_s);
      return f;
    }
    try {
      if (const auto value = store_->try_get(key("decision"))) {
        const std::string reason = decode_decision(*value).value_or(Decision{false, false, "(an unreadable decision)"}).reason;
        f.kind = launch::FailureKind::kRemote;
        f.description = "node 0 stopped the group: " + reason.substr(0, reason.find('\n'));
        return f;
      }
    } catch (const Error&) {}
    return std::nullopt;
  }
  // Node 0: the other nodes' reports and liveness, then the workers' heartbeats. Its store is
  // in this process, so errors here are unexpected: they must not kill the launcher.
  try {
    return poll_as_node_zero(t, f);
  } catch (const Error& e) {
    log::warn(std::string("watchdog: ") + e.what());
    return std::nullopt;
  }
}

std::optional<launch::WorkerFailure> GroupWatch::poll_as_node_zero(double t, launch::WorkerFailure f) {
  for (int k = 1; k < o_.nnodes; ++k) {
    if (auto remote = report_of(k)) return remote;
    const Node& n = refresh_node(k, t);
    if (n.seen && t - n.last_change_s > o_.heartbeat_timeout_s) {
      f.kind = launch::FailureKind::kNodeLost;
      f.host = n.beat.host;
      f.description =
          fmt::format("lost node {} ({}): its launcher has not been heard from for {:.0f} s (launch.heartbeat_timeout_s = {:g}); {}", k,
                      f.host, t - n.last_change_s, o_.heartbeat_timeout_s, hangs_.positions(t));
      return f;
    }
  }
  // One batched read of every rank's heartbeat (two round trips once all ranks have beaten).
  if (heartbeat_keys_.empty())
    for (int r = 0; r < o_.world_size; ++r) heartbeat_keys_.push_back(run::heartbeat_key(o_.store_run_key, r));
  const auto beats = store_->try_get_many(heartbeat_keys_);
  for (int r = 0; r < o_.world_size; ++r) hangs_.observe(r, beats[static_cast<size_t>(r)], t);
  const launch::HangWatch::Verdict v = hangs_.check(t);
  if (!v.hung) return std::nullopt;
  f.kind = launch::FailureKind::kHang;
  f.rank = v.stuck.empty() ? -1 : v.stuck[0];
  f.host = v.host;
  f.description = "hang: " + v.report;
  return f;
}

const GroupWatch::Node& GroupWatch::refresh_node(int k, double t) {
  Node& n = nodes_[static_cast<size_t>(k)];
  const std::optional<std::string> value = store_->try_get(key("node/" + std::to_string(k)));
  if (value && *value != n.last)
    n.last = *value, n.beat = decode_node_beat(*value).value_or(NodeBeat{}), n.last_change_s = t, n.seen = true;
  return n;
}

bool GroupWatch::stopped_or_gone(int k) {
  const auto value = store_->try_get(key("node/" + std::to_string(k)));
  if (!value) return true;
  const auto b = decode_node_beat(*value);
  return (b && b->state == NodeState::kStopped) || node_silent(k, now());
}

bool GroupWatch::node_silent(int k, double t) {
  // After a failure there is no time for the full heartbeat timeout: a launcher that missed a
  // few of its beats (it beats every watch period) is gone.
  const Node& n = refresh_node(k, t);
  const double period = static_cast<double>(run::heartbeat_period(o_.heartbeat_timeout_s).count()) / 1000.0;
  return n.seen && t - n.last_change_s > std::min(o_.heartbeat_timeout_s, 3.0 * period + 0.5);
}

std::vector<int> GroupWatch::lost_nodes() {
  std::vector<int> lost;
  try {
    for (int k = 1; k < o_.nnodes; ++k)
      if (node_silent(k, now())) lost.push_back(k);
  } catch (const Error&) {}
  return lost;
}

std::optional<launch::WorkerFailure> GroupWatch::report_of(int node) {
  if (taken_[static_cast<size_t>(node)]) return std::nullopt;  // already handed out
  const auto failed = store_->try_get(key("failed/" + std::to_string(node)));
  if (!failed) return std::nullopt;
  taken_[static_cast<size_t>(node)] = true;
  launch::WorkerFailure remote = decode_failure(*failed);
  remote.node = node;
  return remote;
}

std::vector<launch::WorkerFailure> GroupWatch::gather_reports(double wait_s) {
  std::vector<launch::WorkerFailure> out;
  if (o_.node_rank != 0) return out;
  std::vector<bool> done(static_cast<size_t>(o_.nnodes), false);
  done[0] = true;
  const double deadline = now() + wait_s;
  for (;;) {
    try {
      for (int k = 1; k < o_.nnodes; ++k) {
        if (done[static_cast<size_t>(k)]) continue;
        if (taken_[static_cast<size_t>(k)]) {
          done[static_cast<size_t>(k)] = true;
        } else if (auto r = report_of(k)) {
          out.push_back(*r);
          done[static_cast<size_t>(k)] = true;
        } else if (stopped_or_gone(k)) {
          done[static_cast<size_t>(k)] = true;  // never joined, stopped without a failure of its own, or gone
        }
      }
    } catch (const Error&) {
      break;
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; }) || now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return out;
}

std::string GroupWatch::positions() const { return o_.node_rank == 0 ? hangs_.positions(now()) : std::string(); }

void GroupWatch::report_failure(const launch::WorkerFailure& failure) {
  try {
    store_->set(key("failed/" + std::to_string(o_.node_rank)), encode_failure(failure));
  } catch (const Error& e) {
    log::warn(std::string("could not report the failure to node 0: ") + e.what());
  }
}

void GroupWatch::decide(const Decision& d) {
  store_->set(key("decision"), encode_decision(d));
  if (o_.nnodes == 1) return;
  // Wait until every node's launcher has seen it and stopped its workers, so that none of them
  // mistakes the store's restart for node 0's loss.
  const double deadline = now() + o_.heartbeat_timeout_s;
  for (int k = 1; k < o_.nnodes; ++k) {
    while (now() < deadline && !stopped_or_gone(k)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<Decision> GroupWatch::await_decision() {
  beat(NodeState::kStopped);
  const double deadline = now() + o_.heartbeat_timeout_s;
  while (now() < deadline) {
    try {
      if (const auto value = store_->try_get(key("decision"))) {
        beat(NodeState::kStopped);
        return decode_decision(*value);  // unreadable: treated as node 0 gone
      }
    } catch (const Error&) {
      return std::nullopt;  // node 0 is gone
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

}  // namespace dstrain::launch
