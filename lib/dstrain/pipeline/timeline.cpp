#include "dstrain/pipeline/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dstrain/pipeline/transfers.h"

namespace dstrain::pipeline {

namespace {

// A send's slot in the table of send times: sends are keyed by what they carry.
size_t send_slot(const Schedule& s, Op send, int stage, int micro_batch) {
  const size_t direction = send == Op::kSendForward ? 0 : 1;
  return (direction * static_cast<size_t>(s.stages()) + static_cast<size_t>(stage)) * static_cast<size_t>(s.micro_batches) +
         static_cast<size_t>(micro_batch);
}

double duration(const Action& a, const Costs& c, int v) {
  switch (a.op) {
    case Op::kForward:
      return c.forward / v;
    case Op::kBackward:
      return (c.backward_input + c.backward_weight) / v;
    case Op::kBackwardInput:
      return c.backward_input / v;
    case Op::kBackwardWeight:
      return c.backward_weight / v;
    default:
      return 0;
  }
}

bool in_range(const Schedule& s, const Action& a) {
  return a.stage >= 0 && a.stage < s.stages() && a.micro_batch >= 0 && a.micro_batch < s.micro_batches;
}

}  // namespace

double Timeline::bubble() const {
  const double work = std::accumulate(busy.begin(), busy.end(), 0.0);
  return work > 0 ? (static_cast<double>(busy.size()) * makespan - work) / work : 0.0;
}

Timeline simulate(const Schedule& s, const Costs& costs) {
  const int P = s.ranks;
  Timeline tl;
  tl.busy.assign(P, 0.0), tl.spans.assign(P, {});
  tl.peak_activations.assign(P, 0), tl.peak_weight_stash.assign(P, 0), tl.peak_held.assign(P, 0);
  std::vector<double> sent(2 * static_cast<size_t>(s.stages()) * static_cast<size_t>(s.micro_batches), -1.0);
  std::vector<size_t> next(P, 0);
  std::vector<double> clock(P, 0.0);
  std::vector<int> whole(P, 0), stash(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      for (; next[r] < s.actions[r].size(); ++next[r]) {
        const Action& a = s.actions[r][next[r]];
        if (!in_range(s, a)) continue;  // validate() names it; the replay skips it
        if (is_receive(a.op)) {
          const Action send = matching_send(a);
          if (!in_range(s, send)) continue;
          const double at = sent[send_slot(s, send.op, send.stage, send.micro_batch)];
          if (at < 0) break;  // not sent yet: wait
          clock[r] = std::max(clock[r], at + costs.transfer);
        } else if (is_send(a.op)) {
          sent[send_slot(s, a.op, a.stage, a.micro_batch)] = clock[r];
        } else {
          const double d = duration(a, costs, s.virtual_stages);
          tl.spans[r].push_back({clock[r], clock[r] + d, a});
          clock[r] += d, tl.busy[r] += d;
          whole[r] += a.op == Op::kForward ? 1 : a.op == Op::kBackward || a.op == Op::kBackwardInput ? -1 : 0;
          stash[r] += a.op == Op::kBackwardInput ? 1 : a.op == Op::kBackwardWeight ? -1 : 0;
          tl.peak_activations[r] = std::max(tl.peak_activations[r], whole[r]);
          tl.peak_weight_stash[r] = std::max(tl.peak_weight_stash[r], stash[r]);
          tl.peak_held[r] = std::max(tl.peak_held[r], whole[r] + stash[r]);
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r) {
    tl.makespan = std::max(tl.makespan, clock[r]);
    if (next[r] < s.actions[r].size()) {
      const Action& a = s.actions[r][next[r]];
      tl.deadlock += fmt::format("{}rank {} waits at {} (action {}) for {}, which never comes", tl.deadlock.empty() ? "" : "; ", r,
                                 action_text(a), next[r], action_text(matching_send(a)));
    }
  }
  return tl;
}

double bubble_formula(const Schedule& s, const Costs& c) {
  const double p = s.ranks, m = s.micro_batches, v = s.virtual_stages;
  switch (s.kind) {
    case ScheduleKind::kGpipe:
    case ScheduleKind::k1F1B:
      return (p - 1) / m;
    case ScheduleKind::kInterleaved1F1B:
      return (p - 1) / (v * m);
    case ScheduleKind::kZbH1: {
      const double total = c.forward + c.backward_input + c.backward_weight;
      return (p - 1) * std::max(0.0, c.forward + c.backward_input - c.backward_weight) / (m * total);
    }
  }
  return 0;
}

std::string timeline_chart(const Timeline& tl, double unit, int max_columns) {
  const int columns = std::min(max_columns, static_cast<int>(std::ceil(tl.makespan / unit - 1e-9)));
  std::string out;
  for (size_t r = 0; r < tl.spans.size(); ++r) {
    std::string row(static_cast<size_t>(std::max(columns, 0)), '.');
    for (const Span& span : tl.spans[r]) {
      static const char letters[] = "FBIW";
      char letter = letters[static_cast<int>(span.action.op)];
      if (span.action.micro_batch % 2 == 1) letter = static_cast<char>(letter - 'A' + 'a');
      const int from = static_cast<int>(std::floor(span.start / unit + 1e-9)), to = static_cast<int>(std::ceil(span.end / unit - 1e-9));
      for (int col = from; col < std::min(to, columns); ++col) row[static_cast<size_t>(col)] = letter;
    }
    out += fmt::format("  rank {:>2} |{}|{}\n", r, row, columns < std::ceil(tl.makespan / unit - 1e-9) ? " ..." : "");
  }
  return out;
}

}  // namespace dstrain::pipeline
