#include "dstrain/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "dstrain/core/error.h"
#include "dstrain/pipeline/transfers.h"
#include "dstrain/pipeline/zero_bubble.h"

namespace dstrain::pipeline {

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"};
  return names;
}
const std::string& schedule_name(ScheduleKind kind) { return schedule_names().at(static_cast<size_t>(kind)); }

bool is_compute(Op op) { return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput || op == Op::kBackwardWeight; }

std::string action_text(const Action& a) {
  static const char* const names[] = {"F", "B", "I", "W", "SF", "RF", "SB", "RB"};
  std::string text = fmt::format("{}{}.{}", names[static_cast<int>(a.op)], a.stage, a.micro_batch);
  if (a.peer >= 0 && (a.op == Op::kSendForward || a.op == Op::kSendBackward)) text += fmt::format(">{}", a.peer);
  if (a.peer >= 0 && (a.op == Op::kRecvForward || a.op == Op::kRecvBackward)) text += fmt::format("<{}", a.peer);
  return text;
}

std::string schedule_rule_problem(ScheduleKind kind, int ranks, int virtual_stages, int micro_batches) {
  const std::string& name = schedule_name(kind);
  if (ranks < 2) return fmt::format("a pipeline needs at least 2 stages' ranks (it has {})", ranks);
  if (micro_batches < 1) return fmt::format("a step needs at least one micro-batch (it has {})", micro_batches);
  const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
  if (interleaved && virtual_stages < 2)
    return fmt::format("{} needs at least 2 virtual stages per rank (it has {}); with 1, use 1f1b", name, virtual_stages);
  if (!interleaved && virtual_stages != 1)
    return fmt::format("{} runs one stage per rank (virtual stages {}); interleaved_1f1b is the schedule with virtual stages", name,
                       virtual_stages);
  if (kind != ScheduleKind::kGpipe && micro_batches < ranks)
    return fmt::format(
        "{} needs at least as many micro-batches per step as pipeline ranks ({} < {}): with fewer, the pipeline never fills "
        "(gpipe accepts any number)",
        name, micro_batches, ranks);
  return "";
}

namespace {

Action compute(Op op, int stage, int micro_batch) { return Action{op, stage, micro_batch, -1}; }

std::vector<std::vector<Action>> gpipe(int ranks, int m) {
  std::vector<std::vector<Action>> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < m; ++i) out[r].push_back(compute(Op::kForward, r, i));
    for (int i = 0; i < m; ++i) out[r].push_back(compute(Op::kBackward, r, i));
  }
  return out;
}

// Warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
std::vector<Action> one_forward_one_backward(const std::vector<Action>& forwards, const std::vector<Action>& backwards, size_t warmup) {
  warmup = std::min(warmup, forwards.size());
  std::vector<Action> out(forwards.begin(), forwards.begin() + static_cast<long>(warmup));
  size_t f = warmup, b = 0;
  while (f < forwards.size()) out.push_back(forwards[f++]), out.push_back(backwards[b++]);
  while (b < backwards.size()) out.push_back(backwards[b++]);
  return out;
}

std::vector<std::vector<Action>> one_f_one_b(int ranks, int m) {
  std::vector<std::vector<Action>> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    std::vector<Action> forwards, backwards;
    for (int i = 0; i < m; ++i) forwards.push_back(compute(Op::kForward, r, i)), backwards.push_back(compute(Op::kBackward, r, i));
    out[r] = one_forward_one_backward(forwards, backwards, static_cast<size_t>(ranks - r - 1));
  }
  return out;
}

// Megatron's interleaved 1F1B, depth first: micro-batches go through a rank's chunks in rounds of
// about `ranks` (torch's rounds = m // ranks; here the rounds' sizes differ by at most one, so
// that any m >= ranks works), forwards chunk 0 → v-1, backwards v-1 → 0; rank r warms up with
// (v - 1) x (the first round) + 2 (ranks - 1 - r) forwards.
std::vector<std::vector<Action>> interleaved(int ranks, int v, int m) {
  const int rounds = std::max(1, m / ranks);
  std::vector<std::pair<int, int>> round_spans;  // [first micro-batch, end)
  for (int k = 0, first = 0; k < rounds; ++k) {
    const int size = m / rounds + (k < m % rounds ? 1 : 0);
    round_spans.emplace_back(first, first + size), first += size;
  }
  std::vector<std::vector<Action>> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    std::vector<Action> forwards, backwards;
    for (const auto& [first, end] : round_spans) {
      for (int c = 0; c < v; ++c)
        for (int i = first; i < end; ++i) forwards.push_back(compute(Op::kForward, c * ranks + r, i));
      for (int c = v - 1; c >= 0; --c)
        for (int i = first; i < end; ++i) backwards.push_back(compute(Op::kBackward, c * ranks + r, i));
    }
    const int first_round = round_spans.front().second;
    out[r] = one_forward_one_backward(forwards, backwards, static_cast<size_t>((v - 1) * first_round + 2 * (ranks - 1 - r)));
  }
  return out;
}

// A send without its peer: what a link carries, comparable with a receive's matching_send().
Action carried(const Action& send) { return {send.op, send.stage, send.micro_batch, -1}; }
struct Before {
  bool operator()(const Action& x, const Action& y) const {
    return std::tie(x.op, x.stage, x.micro_batch, x.peer) < std::tie(y.op, y.stage, y.micro_batch, y.peer);
  }
};

// NCCL (and Gloo without tags) delivers a pair's messages in the order they were sent, so each
// rank must receive from a peer in that peer's send order. Where the compute order wants a
// later message first, the earlier ones are received ahead of their need (and held).
void receive_in_send_order(Schedule& s) {
  std::map<std::pair<int, int>, std::deque<Action>> sent;  // (from, to) -> the messages in send order
  for (int r = 0; r < s.ranks; ++r)
    for (const Action& a : s.actions[r])
      if (is_send(a.op)) sent[{r, a.peer}].push_back(carried(a));
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<Action> out;
    std::set<Action, Before> early;  // the sends received ahead of the compute that needs them
    for (const Action& a : s.actions[r]) {
      if (!is_receive(a.op)) {
        out.push_back(a);
        continue;
      }
      const Action want = matching_send(a);
      if (early.erase(want)) continue;
      auto& queue = sent[{a.peer, r}];
      while (!queue.empty() && !(queue.front() == want)) {  // messages sent before the one wanted
        out.push_back(matching_receive(queue.front(), a.peer));
        early.insert(queue.front());
        queue.pop_front();
      }
      if (!queue.empty()) queue.pop_front();
      out.push_back(a);  // (an unmatched receive stays for validate() to name)
    }
    s.actions[r] = std::move(out);
  }
}

}  // namespace

Schedule with_transfers(Schedule s) {
  const int last = s.stages() - 1;
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.actions[r]) {
      const bool forward = a.op == Op::kForward, input_gradient = a.op == Op::kBackward || a.op == Op::kBackwardInput;
      if (forward && a.stage > 0) out.push_back({Op::kRecvForward, a.stage, a.micro_batch, s.rank_of(a.stage - 1)});
      if (input_gradient && a.stage < last) out.push_back({Op::kRecvBackward, a.stage, a.micro_batch, s.rank_of(a.stage + 1)});
      out.push_back(a);
      if (forward && a.stage < last) out.push_back({Op::kSendForward, a.stage, a.micro_batch, s.rank_of(a.stage + 1)});
      if (input_gradient && a.stage > 0) out.push_back({Op::kSendBackward, a.stage, a.micro_batch, s.rank_of(a.stage - 1)});
    }
    s.actions[r] = std::move(out);
  }
  receive_in_send_order(s);
  return s;
}

Schedule build_schedule(ScheduleKind kind, int ranks, int virtual_stages, int micro_batches) {
  const std::string problem = schedule_rule_problem(kind, ranks, virtual_stages, micro_batches);
  if (!problem.empty()) throw Error(ErrorCode::kConfig, "pipeline schedule " + schedule_name(kind) + ": " + problem);
  Schedule s;
  s.kind = kind, s.ranks = ranks, s.virtual_stages = virtual_stages, s.micro_batches = micro_batches;
  switch (kind) {
    case ScheduleKind::kGpipe:
      s.actions = gpipe(ranks, micro_batches);
      break;
    case ScheduleKind::k1F1B:
      s.actions = one_f_one_b(ranks, micro_batches);
      break;
    case ScheduleKind::kInterleaved1F1B:
      s.actions = interleaved(ranks, virtual_stages, micro_batches);
      break;
    case ScheduleKind::kZbH1:
      s.actions = zero_bubble_h1(ranks, micro_batches);
      break;
  }
  return with_transfers(std::move(s));
}

Schedule forward_only_schedule(int ranks, int virtual_stages, int micro_batches) {
  Schedule s;
  s.kind = ScheduleKind::kGpipe, s.ranks = ranks, s.virtual_stages = virtual_stages, s.micro_batches = micro_batches;
  s.actions.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (int mb = 0; mb < micro_batches; ++mb)
      for (int stage = r; stage < s.stages(); stage += ranks) s.actions[static_cast<size_t>(r)].push_back({Op::kForward, stage, mb});
  return with_transfers(std::move(s));
}

std::string schedule_text(const Schedule& s) {
  std::string out;
  for (int r = 0; r < s.ranks; ++r) {
    out += fmt::format("rank {}:", r);
    for (const Action& a : s.actions[r]) out += " " + action_text(a);
    out += "\n";
  }
  return out;
}

}  // namespace dstrain::pipeline
