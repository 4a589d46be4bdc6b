#include "dstrain/launch/hang_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dstrain/core/rank_list.h"

namespace dstrain::launch {

HangWatch::HangWatch(int world_size, double heartbeat_timeout_s, double collective_timeout_s)
    : ranks_(static_cast<size_t>(world_size)), heartbeat_timeout_s_(heartbeat_timeout_s), collective_timeout_s_(collective_timeout_s) {}

void HangWatch::observe(int rank, const std::optional<std::string>& value, double now_s) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || !value) return;
  progress::Beat beat;
  if (!progress::decode(*value, beat)) return;
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (!r.seen || beat.beat != r.beat.beat) r.last_change_s = now_s;
  r.seen = true;
  r.beat = beat;
}

void HangWatch::observe_aged(int rank, const std::string& value, double age_s, double now_s) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  progress::Beat beat;
  if (!progress::decode(value, beat)) return;
  Rank& r = ranks_[static_cast<size_t>(rank)];
  r.seen = true;
  r.beat = beat;
  r.last_change_s = now_s - std::max(age_s, 0.0);
}

std::optional<double> HangWatch::age(int rank, double now_s) const {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || !ranks_[static_cast<size_t>(rank)].seen) return std::nullopt;
  return stale_for(ranks_[static_cast<size_t>(rank)], now_s);
}

HangWatch::Verdict HangWatch::check(double now_s) const {
  Verdict v;
  // 1. Frozen or vanished processes: their heartbeat thread stopped too.
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (r.seen && r.beat.where.phase != progress::Phase::kFinished && stale_for(r, now_s) > heartbeat_timeout_s_)
      v.stuck.push_back(static_cast<int>(i));
  }
  if (!v.stuck.empty()) {
    const Rank& first = ranks_[static_cast<size_t>(v.stuck[0])];
    v.hung = true;
    v.host = first.beat.host;
    v.report = fmt::format("{} ({}) stopped responding: no heartbeat for {:.0f} s (launch.heartbeat_timeout_s = {:g}), last heard in {}",
                           format_ranks(v.stuck), first.beat.host, stale_for(first, now_s), heartbeat_timeout_s_,
                           progress::describe(first.beat.where));
  } else {
    // 2. A collective past its timeout: blame the ranks that are not in it.
    int longest = -1;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const Rank& r = ranks_[i];
      if (r.seen && r.beat.where.phase == progress::Phase::kCollective && in_phase_for(r, now_s) > collective_timeout_s_ &&
          (longest < 0 || in_phase_for(r, now_s) > in_phase_for(ranks_[static_cast<size_t>(longest)], now_s)))
        longest = static_cast<int>(i);
    }
    if (longest < 0) return v;
    const progress::Snapshot& op = ranks_[static_cast<size_t>(longest)].beat.where;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const progress::Snapshot& w = ranks_[i].beat.where;
      const bool in_op = w.phase == progress::Phase::kCollective && w.op == op.op && w.seq == op.seq;
      // A pipeline's send or receive waits on one neighbour, with its own sequence numbers: such
      // a rank waits too, it is not the one that is stuck.
      const bool point_to_point = w.phase == progress::Phase::kCollective && (w.op == "send" || w.op == "recv");
      if (!ranks_[i].seen || (!in_op && !point_to_point)) v.stuck.push_back(static_cast<int>(i));
    }
    v.hung = true;
    if (v.stuck.empty()) {
      v.report = fmt::format(
          "every rank has waited in {} for {:.0f} s (launch.collective_timeout_s = {:g}): the network or the collective library is stuck",
          progress::describe(op), in_phase_for(ranks_[static_cast<size_t>(longest)], now_s), collective_timeout_s_);
    } else {
      const Rank& first = ranks_[static_cast<size_t>(v.stuck[0])];
      v.host = first.beat.host;
      v.report = fmt::format("{} ({}) stuck in {} for {:.0f} s while others wait in {} (launch.collective_timeout_s = {:g})",
                             format_ranks(v.stuck), first.seen ? first.beat.host : "?",
                             first.seen ? progress::describe(first.beat.where) : "(no heartbeat yet)",
                             first.seen ? in_phase_for(first, now_s) : 0.0, progress::describe(op), collective_timeout_s_);
    }
  }
  v.report += "; " + positions(now_s);
  return v;
}

std::string HangWatch::positions(double now_s) const {
  // Group by where, in order of the first rank of each group.
  std::map<std::string, std::vector<int>> groups;
  std::map<std::string, double> longest;
  std::vector<std::string> order;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    std::string where = r.seen ? progress::describe(r.beat.where) : "no heartbeat yet";
    if (r.seen && stale_for(r, now_s) > heartbeat_timeout_s_ && r.beat.where.phase != progress::Phase::kFinished)
      where += " (heartbeat stale)";
    if (!groups.count(where)) order.push_back(where);
    groups[where].push_back(static_cast<int>(i));
    if (r.seen) longest[where] = std::max(longest[where], in_phase_for(r, now_s));
  }
  std::string out;
  for (const auto& where : order) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{}: {}", format_ranks(groups[where]), where);
    if (longest.count(where) && where.rfind("finished", 0) != 0) out += fmt::format(" for {:.0f} s", longest[where]);
  }
  return out;
}

}  // namespace dstrain::launch
