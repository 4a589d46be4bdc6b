// The parallel layout (config/parallel_layout.h) and its groups (comm/parallel_groups.h): the one
// rank formula, stage-major; the groups split once from the world hold the ranks it says, and a
// layout of another size is refused.
#include <mutex>
#include <vector>

#include "catch_torch.h"
#include "dstrain/comm/parallel_groups.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"

using namespace dstrain;

TEST_CASE("parallel layout: stage-major ranks, data groups consecutive, pipelines strided", "[comm]") {
  config::Recipe r;
  r.launch.nproc_per_node = 4, r.launch.nnodes = 2;
  r.parallel.pipeline_parallel_size = 2, r.moe.expert_parallel_size = 2;
  const config::ParallelLayout l = r.layout();
  CHECK(l.world == 8);
  CHECK(l.data() == 4);
  CHECK(r.data_parallel_size() == 4);
  for (int rank = 0; rank < 8; ++rank) CHECK(l.rank_of(l.pipeline_rank(rank), l.data_rank(rank)) == rank);
  CHECK(l.pipeline_rank(5) == 1);
  CHECK(l.data_rank(5) == 1);
  CHECK(l.data_groups() == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(l.pipeline_groups() == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
}

TEST_CASE("parallel groups: split once from the world as the layout says", "[comm]") {
  std::mutex mu;
  std::vector<std::vector<int>> sizes(8);
  comm::run_on_threads(8, [&](comm::Communicator& world) {
    const comm::ParallelGroups g = comm::open_parallel_groups(world, config::ParallelLayout{8, 2, 2});
    REQUIRE(g.data_parallel);
    REQUIRE(g.pipeline);
    REQUIRE(g.expert_parallel);
    const std::lock_guard<std::mutex> lock(mu);
    const int r = world.rank();
    sizes[static_cast<size_t>(r)] = {g.data().world_size(),           g.data().rank(),
                                     g.pipeline->world_size(),        g.pipeline->rank(),
                                     g.expert_parallel->world_size(), g.expert_data->world_size()};
    CHECK(g.data().rank() == r % 4);            // the data rank
    CHECK(g.pipeline->rank() == r / 4);         // the pipeline rank
    CHECK(g.expert_parallel->rank() == r % 2);  // E consecutive ranks of the data-parallel group
  });
  for (const auto& s : sizes) CHECK(s == std::vector<int>{4, s[1], 2, s[3], 2, 2});
  comm::run_on_threads(2, [&](comm::Communicator& world) {
    const comm::ParallelGroups flat = comm::open_parallel_groups(world, config::ParallelLayout{2, 1, 1});
    CHECK(&flat.data() == &world);  // no pipeline, no experts: the world is the data-parallel group
    CHECK_FALSE(flat.pipeline);
    CHECK_FALSE(flat.expert_parallel);
    CHECK_THROWS_AS(comm::open_parallel_groups(world, config::ParallelLayout{4, 2, 1}), Error);
  });
}
