#include "dstrain/pipeline/validate.h"

#include <fmt/format.h>

#include <map>

#include "dstrain/pipeline/timeline.h"
#include "dstrain/pipeline/transfers.h"

namespace dstrain::pipeline {

namespace {

constexpr int kOps = 8;

// Where each (op, stage, micro-batch) sits in its rank's list, and how often it occurs.
struct Seen {
  int count = 0;
  size_t position = 0;
};

class Checker {
 public:
  Checker(const Schedule& s, size_t max_problems) : s_(s), max_(max_problems) {}

  std::vector<std::string> run() {
    if (s_.ranks < 1 || static_cast<int>(s_.actions.size()) != s_.ranks)
      return {fmt::format("the schedule has {} action lists for {} ranks", s_.actions.size(), s_.ranks)};
    for (int r = 0; r < s_.ranks; ++r)
      for (size_t i = 0; i < s_.actions[r].size(); ++i) place(r, i, s_.actions[r][i]);
    for (int stage = 0; stage < s_.stages(); ++stage)
      for (int mb = 0; mb < s_.micro_batches; ++mb) check_unit(stage, mb);
    check_link_order();
    if (problems_.empty()) {
      const Timeline tl = simulate(s_, Costs{});
      if (!tl.deadlock.empty()) problem("the schedule deadlocks: " + tl.deadlock);
    }
    return problems_;
  }

 private:
  void problem(std::string text) {
    if (problems_.size() < max_) problems_.push_back(std::move(text));
  }

  void place(int r, size_t i, const Action& a) {
    const std::string where = fmt::format("rank {} action {} ({})", r, i, action_text(a));
    if (a.stage < 0 || a.stage >= s_.stages() || a.micro_batch < 0 || a.micro_batch >= s_.micro_batches)
      return problem(
          fmt::format("{}: stage or micro-batch out of range ({} stages, {} micro-batches)", where, s_.stages(), s_.micro_batches));
    if (s_.rank_of(a.stage) != r) return problem(fmt::format("{}: stage {} lives on rank {}", where, a.stage, s_.rank_of(a.stage)));
    const int last = s_.stages() - 1;
    int peer = -1;
    switch (a.op) {
      case Op::kSendForward:
        peer = a.stage < last ? s_.rank_of(a.stage + 1) : -2;
        break;
      case Op::kRecvForward:
        peer = a.stage > 0 ? s_.rank_of(a.stage - 1) : -2;
        break;
      case Op::kSendBackward:
        peer = a.stage > 0 ? s_.rank_of(a.stage - 1) : -2;
        break;
      case Op::kRecvBackward:
        peer = a.stage < last ? s_.rank_of(a.stage + 1) : -2;
        break;
      default:
        break;
    }
    if (peer == -2) return problem(fmt::format("{}: stage {} has no neighbour in that direction", where, a.stage));
    if (peer >= 0 && a.peer != peer) return problem(fmt::format("{}: the peer must be rank {}", where, peer));
    Seen& seen = seen_[key(a.op, a.stage, a.micro_batch)];
    if (seen.count++ == 0) seen.position = i;
  }

  static long key(Op op, int stage, int mb) { return (static_cast<long>(stage) * 1000003L + mb) * kOps + static_cast<int>(op); }
  const Seen* find(Op op, int stage, int mb) const {
    const auto it = seen_.find(key(op, stage, mb));
    return it == seen_.end() ? nullptr : &it->second;
  }
  int count(Op op, int stage, int mb) const {
    const Seen* seen = find(op, stage, mb);
    return seen ? seen->count : 0;
  }

  void expect_count(Op op, int stage, int mb, int want) {
    const int got = count(op, stage, mb);
    if (got != want)
      problem(fmt::format("rank {}: {} occurs {} time(s), expected {}", s_.rank_of(stage), action_text({op, stage, mb, -1}), got, want));
  }
  // `first` must come before `then` on the stage's rank (when both occur).
  void expect_before(Op first, Op then, int stage, int mb) {
    const Seen *a = find(first, stage, mb), *b = find(then, stage, mb);
    if (a && b && a->position >= b->position)
      problem(fmt::format("rank {}: {} (action {}) must come before {} (action {})", s_.rank_of(stage), action_text({first, stage, mb, -1}),
                          a->position, action_text({then, stage, mb, -1}), b->position));
  }

  void check_unit(int stage, int mb) {
    const int last = s_.stages() - 1;
    const bool split = count(Op::kBackwardInput, stage, mb) > 0 || count(Op::kBackwardWeight, stage, mb) > 0;
    const Op input_gradient = split ? Op::kBackwardInput : Op::kBackward;
    expect_count(Op::kForward, stage, mb, 1);
    expect_count(Op::kBackward, stage, mb, split ? 0 : 1);
    expect_count(Op::kBackwardInput, stage, mb, split ? 1 : 0);
    expect_count(Op::kBackwardWeight, stage, mb, split ? 1 : 0);
    expect_count(Op::kSendForward, stage, mb, stage < last ? 1 : 0);
    expect_count(Op::kRecvForward, stage, mb, stage > 0 ? 1 : 0);
    expect_count(Op::kRecvBackward, stage, mb, stage < last ? 1 : 0);
    expect_count(Op::kSendBackward, stage, mb, stage > 0 ? 1 : 0);
    expect_before(Op::kRecvForward, Op::kForward, stage, mb);
    expect_before(Op::kForward, Op::kSendForward, stage, mb);
    expect_before(Op::kForward, input_gradient, stage, mb);
    expect_before(Op::kRecvBackward, input_gradient, stage, mb);
    expect_before(input_gradient, Op::kSendBackward, stage, mb);
    if (split) expect_before(Op::kBackwardInput, Op::kBackwardWeight, stage, mb);
  }

  // A link delivers in send order (NCCL; Gloo without tags): each rank receives a peer's
  // messages in the order the peer sends them.
  void check_link_order() {
    auto what = [](const Action& send) {
      return fmt::format("the {} of stage {} micro-batch {}", send.op == Op::kSendForward ? "activations" : "gradient", send.stage,
                         send.micro_batch);
    };
    std::map<std::pair<int, int>, std::vector<Action>> sent, received;  // (from, to) -> sends, in order
    for (int r = 0; r < s_.ranks; ++r)
      for (const Action& a : s_.actions[r]) {
        if (is_send(a.op)) sent[{r, a.peer}].push_back({a.op, a.stage, a.micro_batch, -1});
        if (is_receive(a.op)) received[{a.peer, r}].push_back(matching_send(a));
      }
    for (const auto& [link, messages] : sent) {
      const auto& got = received[link];
      for (size_t i = 0; i < messages.size() && i < got.size(); ++i)
        if (!(messages[i] == got[i]))
          return problem(
              fmt::format("rank {} receives {} from rank {} where that rank's message number {} to it is {}: a link "
                          "delivers in send order",
                          link.second, what(got[i]), link.first, i, what(messages[i])));
    }
  }

  const Schedule& s_;
  size_t max_;
  std::map<long, Seen> seen_;
  std::vector<std::string> problems_;
};

}  // namespace

std::vector<std::string> validate(const Schedule& schedule, size_t max_problems) { return Checker(schedule, max_problems).run(); }

}  // namespace dstrain::pipeline
