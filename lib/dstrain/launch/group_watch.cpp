#include "dstrain/launch/group_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>
#include <utility>

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
  std::string out = fmt::format("{} {} {}", b.count, b.host, b.state == NodeState::kStopped ? "stopped" : "running");
  for (const auto& w : b.workers) out += fmt::format("\n{} {} {}", w.rank, static_cast<int64_t>(w.age_s * 1000.0), w.heartbeat);
  return out;
}

std::optional<NodeBeat> decode_node_beat(const std::string& text) {
  std::istringstream in(text);
  NodeBeat b;
  std::string state, line;
  if (!(in >> b.count >> b.host >> state) || (state != "running" && state != "stopped")) return std::nullopt;
  b.state = state == "stopped" ? NodeState::kStopped : NodeState::kRunning;
  std::getline(in, line);  // the rest of the first line
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    WorkerSeen w;
    int64_t age_ms = 0;
    if (!(fields >> w.rank >> age_ms) || !std::getline(fields >> std::ws, w.heartbeat)) continue;  // an unreadable line: that worker unseen
    w.age_s = static_cast<double>(age_ms) / 1000.0;
    b.workers.push_back(std::move(w));
  }
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

GroupWatch::GroupWatch(const Connect& connect, GroupWatchOptions options)
    : store_(connect()), o_(std::move(options)), local_(o_.world_size, o_.heartbeat_timeout_s, o_.collective_timeout_s),
      local_values_(o_.local_ranks.size()), hangs_(o_.world_size, o_.heartbeat_timeout_s, o_.collective_timeout_s),
      nodes_(static_cast<size_t>(o_.nnodes)), taken_(static_cast<size_t>(o_.nnodes), false) {
  host_ = host_name();
  last_contact_s_ = now();
  for (int r : o_.local_ranks) local_keys_.push_back(run::heartbeat_key(o_.store_run_key, r));
  beat(NodeState::kRunning);
  if (o_.node_rank != 0) return;
  for (int k = 0; k < o_.nnodes; ++k) pass_keys_.push_back(key("node/" + std::to_string(k)));
  pass_store_ = connect();
  pass_thread_ = std::thread([this] { pass_loop(); });
}

GroupWatch::~GroupWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (pass_thread_.joinable()) pass_thread_.join();
}

double GroupWatch::now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string GroupWatch::key(const std::string& name) const { return run::store_key(o_.store_run_key, name); }

void GroupWatch::read_local_workers() {
  if (local_keys_.empty()) return;
  try {
    const auto values = store_->try_get_many(local_keys_);
    const double t = now();
    for (size_t i = 0; i < values.size(); ++i) {
      local_.observe(o_.local_ranks[i], values[i], t);
      if (values[i]) local_values_[i] = *values[i];
    }
  } catch (const Error&) {
    // The store is unreachable: the node beat below fails too, and node 0's loss is judged by that.
  }
}

void GroupWatch::beat(NodeState state) {
  NodeBeat b{++beats_, host_, state, {}};
  const double t = now();
  for (size_t i = 0; i < local_values_.size(); ++i)
    if (const auto age = local_.age(o_.local_ranks[i], t)) b.workers.push_back({o_.local_ranks[i], *age, local_values_[i]});
  try {
    store_->set(key("node/" + std::to_string(o_.node_rank)), encode_node_beat(b));
    last_contact_s_ = now();
  } catch (const Error&) {
    // Counted below: only a silence longer than the heartbeat timeout means node 0 is gone.
  }
}

std::optional<launch::WorkerFailure> GroupWatch::poll() {
  read_local_workers();
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
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(found_, std::nullopt);
}

void GroupWatch::pass_loop() {
  const auto period = run::heartbeat_period(o_.heartbeat_timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    pass();
    lock.lock();
  }
}

void GroupWatch::pass() {
  // Node 0's store is in this process, so errors here are unexpected: they must not kill the launcher.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (found_) return;  // one finding at a time, until poll() hands it out
  }
  std::vector<std::optional<std::string>> values;
  try {
    values = pass_store_->try_get_many(pass_keys_);  // every node's beat: one batched read
    // Failure reports are rare: a counter says when there are new ones to read.
    const int64_t reports = pass_store_->add(key("failures"), 0);
    if (reports > reports_read_) {
      reports_read_ = reports;
      for (int k = 1; k < o_.nnodes; ++k)
        values.push_back(handed_out(k) ? std::nullopt : pass_store_->try_get(key("failed/" + std::to_string(k))));
    }
  } catch (const Error& e) {
    log::warn(std::string("watchdog: ") + e.what());
    return;
  }
  const double t = now();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto failure = judge(values, t)) found_ = std::move(failure);
}

std::optional<launch::WorkerFailure> GroupWatch::judge(const std::vector<std::optional<std::string>>& values, double t) {
  launch::WorkerFailure f;
  f.happened = true;
  f.unix_time = unix_seconds();
  const size_t nnodes = static_cast<size_t>(o_.nnodes);
  for (int k = 1; k < o_.nnodes && values.size() > nnodes; ++k) {
    if (auto remote = take_report(k, values[nnodes + static_cast<size_t>(k) - 1])) return remote;
  }
  for (int k = 0; k < o_.nnodes; ++k) note_node(k, values[static_cast<size_t>(k)], t);
  for (int k = 1; k < o_.nnodes; ++k) {
    const Node& n = nodes_[static_cast<size_t>(k)];
    if (n.seen && t - n.last_change_s > o_.heartbeat_timeout_s) {
      f.kind = launch::FailureKind::kNodeLost;
      f.host = n.beat.host;
      f.description =
          fmt::format("lost node {} ({}): its launcher has not been heard from for {:.0f} s (launch.heartbeat_timeout_s = {:g}); {}", k,
                      f.host, t - n.last_change_s, o_.heartbeat_timeout_s, hangs_.positions(t));
      return f;
    }
  }
  const launch::HangWatch::Verdict v = hangs_.check(t);
  if (!v.hung) return std::nullopt;
  f.kind = launch::FailureKind::kHang;
  f.rank = v.stuck.empty() ? -1 : v.stuck[0];
  f.host = v.host;
  f.description = "hang: " + v.report;
  return f;
}

void GroupWatch::note_node(int k, const std::optional<std::string>& value, double t) {
  Node& n = nodes_[static_cast<size_t>(k)];
  if (!value || *value == n.last) return;
  n.last = *value, n.beat = decode_node_beat(*value).value_or(NodeBeat{}), n.last_change_s = t, n.seen = true;
  // Its workers' heartbeats, aged as that node saw them: the verdict follows every rank.
  for (const auto& w : n.beat.workers) hangs_.observe_aged(w.rank, w.heartbeat, w.age_s, t);
}

bool GroupWatch::handed_out(int k) const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_[static_cast<size_t>(k)];
}

GroupWatch::Node GroupWatch::refresh_node(int k, double t) {
  const std::optional<std::string> value = store_->try_get(key("node/" + std::to_string(k)));
  std::lock_guard<std::mutex> lock(mu_);
  note_node(k, value, t);
  return nodes_[static_cast<size_t>(k)];
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
  const Node n = refresh_node(k, t);
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (taken_[static_cast<size_t>(node)]) return std::nullopt;  // already handed out
  }
  const auto failed = store_->try_get(key("failed/" + std::to_string(node)));
  std::lock_guard<std::mutex> lock(mu_);
  return take_report(node, failed);
}

std::optional<launch::WorkerFailure> GroupWatch::take_report(int node, const std::optional<std::string>& value) {
  if (!value || taken_[static_cast<size_t>(node)]) return std::nullopt;  // none, or already handed out
  taken_[static_cast<size_t>(node)] = true;
  launch::WorkerFailure remote = decode_failure(*value);
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
        if (handed_out(k)) {
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

std::string GroupWatch::positions() const {
  if (o_.node_rank != 0) return "";
  std::lock_guard<std::mutex> lock(mu_);
  return hangs_.positions(now());
}

void GroupWatch::report_failure(const launch::WorkerFailure& failure) {
  try {
    store_->set(key("failed/" + std::to_string(o_.node_rank)), encode_failure(failure));
    store_->add(key("failures"), 1);  // node 0's pass reads the reports when this count moves
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
