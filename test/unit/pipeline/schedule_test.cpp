// Pipeline schedules (issue 39): every schedule valid for P in 2..8, m in P..4P, v in {1, 2};
// the rules on their numbers refused by name; broken action lists rejected with the reason; the
// replayed bubble against the papers' formulas; the activations each rank holds.
#include <algorithm>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/timeline.h"
#include "dstrain/pipeline/validate.h"

using namespace dstrain::pipeline;

namespace {

const ScheduleKind kAll[] = {ScheduleKind::kGpipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B, ScheduleKind::kZbH1};

bool contains(const std::vector<std::string>& problems, const std::string& part) {
  return std::any_of(problems.begin(), problems.end(), [&](const std::string& p) { return p.find(part) != std::string::npos; });
}

// Removes the first action equal to `a` on `rank`; true when there was one.
bool erase(Schedule& s, int rank, const Action& a) {
  auto& list = s.actions[rank];
  const auto it = std::find(list.begin(), list.end(), a);
  if (it == list.end()) return false;
  list.erase(it);
  return true;
}

}  // namespace

TEST_CASE("every schedule is valid for P 2..8, m P..4P, v 1 and 2", "[pipeline]") {
  int checked = 0;
  for (const ScheduleKind kind : kAll)
    for (int v = 1; v <= 2; ++v)
      for (int p = 2; p <= 8; ++p)
        for (int m = p; m <= 4 * p; ++m) {
          const std::string rule = schedule_rule_problem(kind, p, v, m);
          const bool wants_virtual = kind == ScheduleKind::kInterleaved1F1B;
          REQUIRE(rule.empty() == (wants_virtual == (v == 2)));  // interleaved needs v >= 2, the others v = 1
          if (!rule.empty()) {
            REQUIRE_THROWS_AS(build_schedule(kind, p, v, m), dstrain::Error);
            continue;
          }
          const Schedule s = build_schedule(kind, p, v, m);
          const auto problems = validate(s);
          INFO(schedule_name(kind) << " P=" << p << " v=" << v << " m=" << m << ": " << (problems.empty() ? "" : problems[0]));
          REQUIRE(problems.empty());
          ++checked;
        }
  CHECK(checked == 4 * 112);  // 4 valid (kind, v) pairs for each of the sum over P of 3P + 1 m's
}

TEST_CASE("the schedules' rules on their numbers are refused by name", "[pipeline]") {
  CHECK(schedule_rule_problem(ScheduleKind::k1F1B, 4, 1, 3).find("at least as many micro-batches") != std::string::npos);
  CHECK(schedule_rule_problem(ScheduleKind::kGpipe, 4, 1, 3).empty());
  CHECK(schedule_rule_problem(ScheduleKind::kInterleaved1F1B, 4, 1, 8).find("at least 2 virtual stages") != std::string::npos);
  CHECK(schedule_rule_problem(ScheduleKind::kZbH1, 4, 2, 8).find("one stage per rank") != std::string::npos);
  CHECK(schedule_rule_problem(ScheduleKind::k1F1B, 1, 1, 8).find("at least 2") != std::string::npos);
  CHECK_THROWS_WITH(build_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 2), Catch::Contains("interleaved_1f1b"));
}

TEST_CASE("a broken action list is rejected with what is wrong", "[pipeline]") {
  const Schedule good = build_schedule(ScheduleKind::k1F1B, 3, 1, 4);
  REQUIRE(validate(good).empty());

  Schedule no_send = good;  // rank 0 never sends micro-batch 2's activations
  REQUIRE(erase(no_send, 0, {Op::kSendForward, 0, 2, 1}));
  CHECK(contains(validate(no_send), "SF0.2 occurs 0 time(s), expected 1"));

  Schedule twice = good;  // a second forward of the same micro-batch
  twice.actions[1].push_back({Op::kForward, 1, 0, -1});
  CHECK(contains(validate(twice), "F1.0 occurs 2 time(s)"));

  Schedule wrong_rank = good;  // stage 2's forward on rank 1
  wrong_rank.actions[1].push_back({Op::kForward, 2, 0, -1});
  CHECK(contains(validate(wrong_rank), "stage 2 lives on rank 2"));

  Schedule wrong_peer = good;
  for (auto& a : wrong_peer.actions[1])
    if (a.op == Op::kSendForward) a.peer = 0;
  CHECK(contains(validate(wrong_peer), "the peer must be rank 2"));

  Schedule backward_first = good;  // the last stage's backward before its forward
  auto& last = backward_first.actions[2];
  const auto f = std::find(last.begin(), last.end(), Action{Op::kForward, 2, 0, -1});
  const auto b = std::find(last.begin(), last.end(), Action{Op::kBackward, 2, 0, -1});
  std::iter_swap(f, b);
  CHECK(contains(validate(backward_first), "F2.0 (action"));

  Schedule out_of_order = good;  // rank 1 receives micro-batch 1's activations before micro-batch 0's
  auto& second = out_of_order.actions[1];
  std::iter_swap(std::find(second.begin(), second.end(), Action{Op::kRecvForward, 1, 0, 0}),
                 std::find(second.begin(), second.end(), Action{Op::kRecvForward, 1, 1, 0}));
  CHECK(contains(validate(out_of_order),
                 "rank 1 receives the activations of stage 0 micro-batch 1 from rank 0 where that rank's "
                 "message number 0 to it is the activations of stage 0 micro-batch 0"));

  // Every local order and the link order hold, but rank 0 waits for micro-batch 0's gradient
  // before it sends the activations that the gradient needs: a deadlock only running finds.
  Schedule cycle = good;
  auto& first = cycle.actions[0];
  for (const Action moved : {Action{Op::kBackward, 0, 0, -1}, Action{Op::kRecvBackward, 0, 0, 1}}) {
    first.erase(std::find(first.begin(), first.end(), moved));
    first.insert(std::find(first.begin(), first.end(), Action{Op::kForward, 0, 0, -1}) + 1, moved);
  }
  const auto problems = validate(cycle);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("deadlocks") != std::string::npos);
  CHECK(problems[0].find("rank 0 waits at RB0.0<1") != std::string::npos);
}

TEST_CASE("the replayed bubble matches the papers' formulas", "[pipeline]") {
  const Costs unit{1, 1, 1, 0};  // F = I = W: a full backward costs twice a forward
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      INFO("P=" << p << " m=" << m);
      for (const ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
        const Schedule s = build_schedule(kind, p, 1, m);
        CHECK(simulate(s, unit).bubble() == Approx(bubble_formula(s, unit)).epsilon(1e-12));
        CHECK(bubble_formula(s, unit) == Approx(double(p - 1) / m));
      }
      const Schedule inter = build_schedule(ScheduleKind::kInterleaved1F1B, p, 2, m);
      if (m % p == 0) CHECK(simulate(inter, unit).bubble() == Approx(double(p - 1) / (2 * m)).epsilon(1e-12));
      CHECK(simulate(inter, unit).bubble() < simulate(build_schedule(ScheduleKind::k1F1B, p, 1, m), unit).bubble());
      // Zero-bubble H1: a third of 1F1B's bubble when F = I = W ((p-1)/(3m)), at most.
      const Schedule zb = build_schedule(ScheduleKind::kZbH1, p, 1, m);
      CHECK(bubble_formula(zb, unit) == Approx(double(p - 1) / (3 * m)));
      CHECK(simulate(zb, unit).bubble() == Approx(bubble_formula(zb, unit)).epsilon(1e-12));
    }
  // Transfers cost time in the replay, not in the formula.
  const Schedule s = build_schedule(ScheduleKind::k1F1B, 4, 1, 8);
  CHECK(simulate(s, Costs{1, 1, 1, 0.1}).bubble() > simulate(s, unit).bubble());
}

TEST_CASE("activations held per rank: 1f1b p - r, gpipe m, zb_h1 p until W", "[pipeline]") {
  for (int p = 2; p <= 8; ++p) {
    const int m = 3 * p;
    const Timeline one = simulate(build_schedule(ScheduleKind::k1F1B, p, 1, m), Costs{});
    const Timeline gpipe = simulate(build_schedule(ScheduleKind::kGpipe, p, 1, m), Costs{});
    const Timeline zb = simulate(build_schedule(ScheduleKind::kZbH1, p, 1, m), Costs{});
    for (int r = 0; r < p; ++r) {
      CHECK(one.peak_activations[r] == p - r);
      CHECK(gpipe.peak_activations[r] == m);
      CHECK(zb.peak_activations[r] <= p - r);  // before I: as 1F1B
      CHECK(zb.peak_held[r] == p);             // until W: 1F1B's peak on every rank
      CHECK(one.peak_weight_stash[r] == 0);
      CHECK(one.peak_held[r] == one.peak_activations[r]);
    }
    // Interleaved (Megatron): rank 0 holds its warm-up plus one chunk, (v - 1) p + 2 (p - 1) + 1.
    const Timeline inter = simulate(build_schedule(ScheduleKind::kInterleaved1F1B, p, 2, m), Costs{});
    CHECK(inter.peak_activations[0] == p + 2 * (p - 1) + 1);
  }
}

TEST_CASE("schedules print as text and as a chart", "[pipeline]") {
  const Schedule s = build_schedule(ScheduleKind::k1F1B, 2, 1, 2);
  CHECK(schedule_text(s) ==
        "rank 0: F0.0 SF0.0>1 F0.1 SF0.1>1 RB0.0<1 B0.0 RB0.1<1 B0.1\n"
        "rank 1: RF1.0<0 F1.0 B1.0 SB1.0>0 RF1.1<0 F1.1 B1.1 SB1.1>0\n");
  const Timeline tl = simulate(s, Costs{1, 1, 1, 0});
  CHECK(tl.makespan == 9);  // (m + p - 1)(F + B)
  CHECK(timeline_chart(tl, 1) ==
        "  rank  0 |Ff..BB.bb|\n"
        "  rank  1 |.FBBfbb..|\n");
}
