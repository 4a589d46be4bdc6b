// all_to_all with uneven counts and split() groups, on the thread group and on real Gloo groups:
// every row arrives where the counts say, subgroups work on their own and beside their parent,
// mismatched counts and bad partitions are named, a failed rank breaks its subgroup at once.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/core/error.h"
#include "gloo_ranks.h"

using namespace dstrain;

namespace {

// Both kinds of group, `world` ranks each; fn runs once per rank. Fails the test on any error.
void on_both_backends(int world, const std::function<void(comm::Communicator&)>& fn) {
  SECTION("thread group") { comm::run_on_threads(world, fn, std::chrono::seconds(30)); }
  SECTION("gloo") {
    comm::StoreServer server("127.0.0.1", 0, "a2a-test", std::chrono::seconds(30));
    for (const std::string& e : test::on_gloo_ranks(world, std::chrono::seconds(30), fn, server, "a2a-test")) REQUIRE(e == "");
  }
}

int64_t rows_from(int src, int dst) { return (src + 2 * dst) % 3; }  // 0, 1 or 2: some pairs send nothing

// Rank src's row i (of those it sends) holds src * 100 + i, twice.
at::Tensor rows_of(int src, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kFloat) + src * 100).unsqueeze(1).repeat({1, 2}).to(dtype);
}

}  // namespace

TEST_CASE("all_to_all delivers uneven rows, zero counts included, in rank order", "[comm][all_to_all]") {
  const int world = 4;
  on_both_backends(world, [&](comm::Communicator& c) {
    const int me = c.rank();
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      std::vector<int64_t> send(world);
      int64_t total = 0;
      for (int d = 0; d < world; ++d) total += send[static_cast<size_t>(d)] = rows_from(me, d);
      const std::vector<int64_t> recv = comm::exchange_counts(c, send);
      std::vector<at::Tensor> want;
      for (int s = 0; s < world; ++s) {
        if (recv[static_cast<size_t>(s)] != rows_from(s, me)) throw std::runtime_error("exchange_counts gave a wrong count");
        int64_t first = 0;
        for (int d = 0; d < me; ++d) first += rows_from(s, d);
        want.push_back(rows_of(s, first + rows_from(s, me), dtype).narrow(0, first, rows_from(s, me)));
      }
      const at::Tensor expected = at::cat(want);
      at::Tensor out = at::full({expected.size(0), 2}, -1.0, at::TensorOptions().dtype(dtype));
      c.all_to_all(rows_of(me, total, dtype), out, send, recv)->wait();
      if (!at::equal(out, expected)) throw std::runtime_error("rank " + std::to_string(me) + " received the wrong rows");
    }
  });
}

TEST_CASE("split gives groups that work on their own and beside their parent", "[comm][split]") {
  const int world = 4;
  on_both_backends(world, [&](comm::Communicator& c) {
    // Groups {0, 3} and {2, 1}: ranked by their place in the list.
    const std::vector<std::vector<int>> pairs{{0, 3}, {2, 1}};
    std::unique_ptr<comm::Communicator> pair = c.split(pairs);
    const int want_rank = c.rank() == 0 || c.rank() == 2 ? 0 : 1;
    if (pair->world_size() != 2 || pair->rank() != want_rank) throw std::runtime_error("wrong place in the pair");
    at::Tensor t = at::full({5}, static_cast<float>(c.rank() + 1));
    pair->all_reduce(t)->wait();
    const float want_sum = c.rank() == 0 || c.rank() == 3 ? 1 + 4 : 3 + 2;
    if (!at::equal(t, at::full({5}, want_sum))) throw std::runtime_error("all_reduce summed outside the pair");
    // The parent still works, and a group splits again (into ranks of their own).
    at::Tensor all = at::ones({3});
    c.all_reduce(all)->wait();
    if (!at::equal(all, at::full({3}, static_cast<float>(world)))) throw std::runtime_error("the parent's all_reduce is wrong");
    std::unique_ptr<comm::Communicator> alone = pair->split({{0}, {1}});
    at::Tensor mine = at::full({2}, static_cast<float>(c.rank()));
    alone->all_reduce(mine)->wait();
    alone->barrier()->wait();
    if (alone->world_size() != 1 || !at::equal(mine, at::full({2}, static_cast<float>(c.rank()))))
      throw std::runtime_error("a group of one changed the tensor");
    pair->broadcast(t, 1)->wait();
    c.barrier()->wait();
  });
}

TEST_CASE("all_to_all names mismatched counts; split refuses a partition that misses or repeats a rank", "[comm][all_to_all]") {
  try {
    comm::run_on_threads(2, [](comm::Communicator& c) {
      // Rank 1 sends 1 row to rank 0; rank 0 expects 2.
      const std::vector<int64_t> send = c.rank() == 0 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{1, 0};
      const std::vector<int64_t> recv = c.rank() == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{0, 0};
      at::Tensor in = at::zeros({1, 4}), out = at::zeros({c.rank() == 0 ? 3 : 0, 4});
      c.all_to_all(in, out, send, recv)->wait();
    });
    FAIL("mismatched counts were accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("rank 1 sends 1 rows to rank 0, which expects 2"));
  }
  CHECK_THROWS_WITH(comm::place_in_partition({{0, 1}, {1}}, 0, 3), Catch::Contains("rank 1 is out of range or in two groups"));
  CHECK_THROWS_WITH(comm::place_in_partition({{0}, {2}}, 0, 3), Catch::Contains("rank 1 is in no group"));
  CHECK(comm::place_in_partition({{2, 0}, {1}}, 0, 3).index == 0);
  CHECK(comm::place_in_partition({{2, 0}, {1}}, 0, 3).rank == 1);
}

TEST_CASE("expert parallelism's partitions: E consecutive ranks exchange, every E-th rank holds the same experts", "[comm][split]") {
  const comm::ExpertPartitions p = comm::expert_partitions(8, 4);
  CHECK(p.parallel == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(p.data == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(comm::expert_partitions(4, 1).parallel == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  CHECK_THROWS_WITH(comm::expert_partitions(6, 4), Catch::Contains("does not divide 6 ranks"));
  comm::run_on_threads(4, [](comm::Communicator& c) {
    const comm::ExpertCommunicators none = comm::split_expert_groups(c, 1);
    if (none.parallel || none.data) throw std::runtime_error("E = 1 split groups");
    const comm::ExpertCommunicators g = comm::split_expert_groups(c, 2);
    if (g.parallel->world_size() != 2 || g.parallel->rank() != c.rank() % 2 || g.data->world_size() != 2 || g.data->rank() != c.rank() / 2)
      throw std::runtime_error("rank " + std::to_string(c.rank()) + " is in the wrong expert groups");
  });
}

TEST_CASE("a rank that fails breaks its subgroup at once, not after the timeout", "[comm][split]") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm::run_on_threads(
        2,
        [](comm::Communicator& c) {
          std::unique_ptr<comm::Communicator> sub = c.split({{1, 0}});
          if (c.rank() == 1) throw Error(ErrorCode::kData, "rank 1 broke");
          sub->barrier()->wait();
        },
        std::chrono::seconds(60));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("rank 1 broke"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
