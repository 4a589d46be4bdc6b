#include "catch_torch.h"

#include <chrono>
#include <memory>
#include <thread>

#include "dstrain/core/progress.h"
#include "dstrain/core/rank_list.h"
#include "dstrain/launch/hang_watch.h"
#include "dstrain/comm/store_client.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/launch/group_watch.h"
#include "dstrain/run/store_keys.h"

using namespace dstrain;

namespace {

std::string beat(uint64_t n, int64_t step, progress::Phase phase, const std::string& op = "", uint64_t seq = 0, double phase_s = 0,
                 const std::string& host = "h", const progress::PipelinePlace& place = {}) {
  progress::Snapshot s;
  s.pipeline = place;
  s.step = step;
  s.phase = phase;
  s.op = op;
  s.seq = seq;
  s.phase_s = phase_s;
  return progress::encode(s, n, host, 1796000000.25 + static_cast<double>(n));
}

}  // namespace

TEST_CASE("rank lists read as ranges", "[launch]") {
  CHECK(format_ranks({3}) == "rank 3");
  CHECK(format_ranks({2, 0, 1, 5, 7, 8}) == "ranks 0\u20132, 5, 7\u20138");
  CHECK(format_ranks({4, 4}) == "rank 4");
}

TEST_CASE("heartbeat values round-trip", "[launch]") {
  progress::Beat b;
  REQUIRE(progress::decode(beat(7, 12, progress::Phase::kCollective, "reduce_scatter", 1742, 1.5, "node-a"), b));
  CHECK(b.beat == 7);
  CHECK(b.where.step == 12);
  CHECK(b.where.phase == progress::Phase::kCollective);
  CHECK(b.where.op == "reduce_scatter");
  CHECK(b.where.seq == 1742);
  CHECK(b.where.phase_s == Approx(1.5));
  CHECK(b.host == "node-a");
  CHECK(b.unix_time == Approx(1796000007.25));
  CHECK(progress::describe(b.where) == "reduce_scatter #1742 (step 12)");
  CHECK_FALSE(progress::decode("v2 1 2 3", b));
  CHECK_FALSE(progress::decode("garbage", b));
  CHECK_FALSE(progress::decode("v1 1 2 99 - 0 0 h 1.0", b));  // no such phase
  CHECK_FALSE(progress::decode("v1 1 2 3 - 0 0 h", b));       // no time
}

TEST_CASE("the progress of this process shows a collective wait and returns after it", "[launch]") {
  progress::set_step(5);
  progress::enter(progress::Phase::kBackward);
  {
    const progress::CollectiveWait wait("all_gather", 9);
    const progress::Snapshot s = progress::snapshot();
    CHECK(s.phase == progress::Phase::kCollective);
    CHECK(s.op == "all_gather");
    CHECK(s.seq == 9);
  }
  CHECK(progress::snapshot().phase == progress::Phase::kBackward);
  CHECK(progress::describe(progress::snapshot()) == "backward of step 5");
}

TEST_CASE("a frozen rank is named with where it was last heard", "[launch]") {
  launch::HangWatch w(4, /*heartbeat*/ 10, /*collective*/ 60);
  for (int r = 0; r < 4; ++r) w.observe(r, beat(1, 12, progress::Phase::kForward), 0);
  CHECK_FALSE(w.check(5).hung);
  // Ranks 0-2 keep beating while waiting; rank 3 is silent from t=0.
  for (int t = 1; t <= 12; ++t)
    for (int r = 0; r < 3; ++r) w.observe(r, beat(1 + t, 12, progress::Phase::kCollective, "reduce_scatter", 1742, t), t);
  CHECK_FALSE(w.check(9.5).hung);
  const auto v = w.check(12);
  REQUIRE(v.hung);
  CHECK(v.stuck == std::vector<int>{3});
  CHECK(v.report.find("rank 3 (h) stopped responding: no heartbeat for 12 s") != std::string::npos);
  CHECK(v.report.find("last heard in forward of step 12") != std::string::npos);
  CHECK(v.report.find("ranks 0\u20132: reduce_scatter #1742 (step 12)") != std::string::npos);
}

TEST_CASE("a collective past its timeout blames the ranks that are not in it", "[launch]") {
  launch::HangWatch w(4, 10, 60);
  for (int t = 0; t <= 70; t += 5) {
    for (int r = 0; r < 4; ++r) {
      if (r == 2)
        w.observe(r, beat(100 + t, 12, progress::Phase::kBackward, "", 0, t), t);  // alive, but never arrives
      else
        w.observe(r, beat(100 + t, 12, progress::Phase::kCollective, "all_reduce", 88, t), t);
    }
    if (t <= 60) CHECK_FALSE(w.check(t).hung);
  }
  const auto v = w.check(70);
  REQUIRE(v.hung);
  CHECK(v.stuck == std::vector<int>{2});
  CHECK(v.report.find("rank 2 (h) stuck in backward of step 12 for 70 s while others wait in all_reduce #88 (step 12)") !=
        std::string::npos);
}

TEST_CASE("a pipeline's place travels in the heartbeat and names the stage, micro-batch and direction", "[launch]") {
  progress::PipelinePlace place;
  place.stage = 2, place.micro_batch = 13, place.carries = progress::Carries::kActivations, place.from_stage = 1, place.to_stage = 2;
  progress::Beat b;
  REQUIRE(progress::decode(beat(3, 4, progress::Phase::kCollective, "recv", 9, 1, "h", place), b));
  CHECK(b.where.pipeline == place);
  CHECK(progress::describe(b.where) == "recv #9 (step 4): micro-batch 13's activations from stage 1 to stage 2");
  place.carries = progress::Carries::kGradient, place.from_stage = 3;
  b.where.pipeline = place;
  CHECK(progress::describe(b.where) == "recv #9 (step 4): micro-batch 13's gradient from stage 3 to stage 2");
  progress::PipelinePlace compute;
  compute.stage = 5, compute.micro_batch = 0;
  REQUIRE(progress::decode(beat(4, 4, progress::Phase::kBackward, "", 0, 1, "h", compute), b));
  CHECK(progress::describe(b.where) == "backward of step 4 (stage 5, micro-batch 0)");
  REQUIRE(progress::decode(beat(5, 4, progress::Phase::kBackward), b));  // no place: none decoded
  CHECK(b.where.pipeline.stage == -1);
  CHECK_FALSE(progress::decode(beat(5, 4, progress::Phase::kBackward) + " q1,2,3", b));
  CHECK_FALSE(progress::decode(beat(5, 4, progress::Phase::kBackward) + " p1,2,7,0,1", b));  // no such carries

  // This process's place, as the executor sets it.
  progress::set_step(4);
  progress::enter(progress::Phase::kForward);
  progress::set_pipeline_place(compute);
  CHECK(progress::describe(progress::snapshot()) == "forward of step 4 (stage 5, micro-batch 0)");
  progress::set_pipeline_place({});
  CHECK(progress::describe(progress::snapshot()) == "forward of step 4");
}

TEST_CASE("a pipeline hang blames the stalled stage, not the neighbours waiting in their receives", "[launch]") {
  launch::HangWatch w(4, 10, 20);
  auto waiting = [](int stage, int from, progress::Carries carries) {
    progress::PipelinePlace p;
    p.stage = stage, p.micro_batch = 0, p.carries = carries, p.from_stage = from, p.to_stage = stage;
    return p;
  };
  for (int t = 0; t <= 25; t += 5) {
    w.observe(0, beat(10 + t, 4, progress::Phase::kCollective, "recv", 31, t, "h", waiting(0, 1, progress::Carries::kGradient)), t);
    w.observe(1, beat(10 + t, 4, progress::Phase::kCollective, "recv", 17, t, "h", waiting(1, 2, progress::Carries::kGradient)), t);
    w.observe(2, beat(10 + t, 4, progress::Phase::kData, "", 0, t), t);  // alive, never sends
    w.observe(3, beat(10 + t, 4, progress::Phase::kCollective, "recv", 12, t, "h", waiting(3, 2, progress::Carries::kActivations)), t);
  }
  const auto v = w.check(25);
  REQUIRE(v.hung);
  CHECK(v.stuck == std::vector<int>{2});
  CHECK(v.report.find("rank 2 (h) stuck in data of step 4") != std::string::npos);
  CHECK(v.report.find("rank 3: recv #12 (step 4): micro-batch 0's activations from stage 2 to stage 3") != std::string::npos);
}

TEST_CASE("every rank in the same collective past its timeout blames the network", "[launch]") {
  launch::HangWatch w(2, 10, 30);
  for (int r = 0; r < 2; ++r) w.observe(r, beat(1, 3, progress::Phase::kCollective, "all_gather", 7, 31), 0);
  const auto v = w.check(0.5);
  REQUIRE(v.hung);
  CHECK(v.stuck.empty());
  CHECK(v.report.find("every rank has waited in all_gather #7") != std::string::npos);
}

TEST_CASE("finished ranks and ranks never heard from are not hangs", "[launch]") {
  launch::HangWatch w(3, 10, 60);
  w.observe(0, beat(1, 30, progress::Phase::kFinished), 0);
  w.observe(1, beat(1, 30, progress::Phase::kCheckpoint), 0);
  CHECK_FALSE(w.check(5).hung);
  for (int t = 1; t < 100; ++t) w.observe(1, beat(1 + t, 30, progress::Phase::kCheckpoint, "", 0, t), t);
  CHECK_FALSE(w.check(99).hung);  // a long save is not a hang while its heartbeat goes on
  CHECK(w.positions(99).find("rank 2: no heartbeat yet") != std::string::npos);
}

TEST_CASE("a node's failure report round-trips through the store value", "[launch]") {
  launch::WorkerFailure f;
  f.happened = true;
  f.kind = launch::FailureKind::kSignal;
  f.rank = 3;
  f.pid = 4242;
  f.host = "node-b";
  f.signal = 9;
  f.unix_time = 1795999781.5;
  f.description = "was killed by signal 9 (SIGKILL)";
  f.tail = {"line one", "line two"};
  const launch::WorkerFailure g = launch::decode_failure(launch::encode_failure(f));
  CHECK(g.kind == f.kind);
  CHECK(g.rank == 3);
  CHECK(g.pid == 4242);
  CHECK(g.host == "node-b");
  CHECK(g.signal == 9);
  CHECK(g.exit_code == -1);
  CHECK(g.unix_time == Approx(f.unix_time));
  CHECK(g.description == f.description);
  CHECK(g.tail == f.tail);
  CHECK(launch::decode_failure("exit\nnot a number").description == "(an unreadable failure report)");
  CHECK(launch::decode_failure("crashed\n1\n2\nh\n-1\n9\n0\nx").description == "(an unreadable failure report)");
}

TEST_CASE("node beats and node 0's decision round-trip through their store values", "[launch]") {
  const launch::NodeBeat stopped{41, "node-b", launch::NodeState::kStopped, {}};
  const auto b = launch::decode_node_beat(launch::encode_node_beat(stopped));
  REQUIRE(b);
  CHECK(b->count == 41);
  CHECK(b->host == "node-b");
  CHECK(b->state == launch::NodeState::kStopped);
  CHECK_FALSE(launch::decode_node_beat("41 node-b sleeping"));
  CHECK_FALSE(launch::decode_node_beat("garbage"));
  // With what the node saw of its workers (an unreadable line leaves that worker out).
  launch::NodeBeat with{
      42,
      "node-b",
      launch::NodeState::kRunning,
      {{8, 1.25, beat(3, 7, progress::Phase::kForward)}, {9, 0, beat(4, 7, progress::Phase::kCollective, "all_reduce", 9)}}};
  const auto w = launch::decode_node_beat(launch::encode_node_beat(with) + "\nnot a worker line");
  REQUIRE(w);
  REQUIRE(w->workers.size() == 2);
  CHECK(w->workers[0].rank == 8);
  CHECK(w->workers[0].age_s == Approx(1.25));
  CHECK(w->workers[0].heartbeat == with.workers[0].heartbeat);
  CHECK(w->workers[1].heartbeat == with.workers[1].heartbeat);

  const launch::Decision d{true, true, "rank 3 on node-b was killed by signal 9\nmore"};
  const auto e = launch::decode_decision(launch::encode_decision(d));
  REQUIRE(e);
  CHECK(e->restart);
  CHECK(e->resume);
  CHECK(e->reason == d.reason);
  const auto f = launch::decode_decision(launch::encode_decision({false, false, "stop"}));
  REQUIRE(f);
  CHECK_FALSE(f->restart);
  CHECK_FALSE(f->resume);
  CHECK_FALSE(launch::decode_decision("maybe fresh\nwhy"));
}

TEST_CASE("node 0 names a frozen rank of another node from that node's beat, reading node keys only", "[launch][group_watch]") {
  comm::StoreServer server("127.0.0.1", 0, "gw-test/0", std::chrono::seconds(30));
  launch::GroupWatchOptions o;
  o.store_run_key = "gw-test/0";
  o.nnodes = 2;
  o.world_size = 4;
  o.heartbeat_timeout_s = 1.2;  // a pass every 200 ms
  o.collective_timeout_s = 600;
  auto connect = [&server] { return std::make_unique<comm::StoreClient>(server.client()); };
  launch::GroupWatchOptions node0 = o, node1 = o;
  node0.local_ranks = {0, 1};
  node1.node_rank = 1, node1.local_ranks = {2, 3};
  launch::GroupWatch watch0(connect, node0), watch1(connect, node1);
  comm::StoreClient workers = server.client();
  const auto start = std::chrono::steady_clock::now();
  std::optional<launch::WorkerFailure> found;
  for (uint64_t n = 1; !found && std::chrono::steady_clock::now() - start < std::chrono::seconds(10); ++n) {
    for (int r = 0; r < 4; ++r)  // rank 3 beats once, then freezes in backward
      if (r != 3 || n == 1)
        workers.set(run::heartbeat_key("gw-test/0", r),
                    beat(n, 5, r == 3 ? progress::Phase::kBackward : progress::Phase::kForward, "", 0, 0, r < 2 ? "host-a" : "host-b"));
    CHECK_FALSE(watch1.poll());
    found = watch0.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(found);
  CHECK(found->kind == launch::FailureKind::kHang);
  CHECK(found->rank == 3);
  CHECK(found->host == "host-b");
  CHECK_THAT(found->description, Catch::Contains("rank 3 (host-b) stopped responding") && Catch::Contains("backward of step 5"));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited < 1.2 + 1.0);  // the timeout plus a node beat and a pass, not more
  CHECK_THAT(watch0.positions(), Catch::Contains("ranks 0\u20132: forward of step 5"));
}
