#include "catch_torch.h"

#include <cstdlib>

#include "dstrain/core/error.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/run/worker_env.h"

using namespace dstrain;

TEST_CASE("worker variables round-trip through the environment", "[launch]") {
  run::WorkerEnv env;
  env.rank = 3;
  env.local_rank = 1;
  env.world_size = 4;
  env.local_world_size = 2;
  env.group_rank = 1;
  env.master_addr = "10.1.2.3";
  env.master_port = 29500;
  env.run_id = "abc";
  env.run_dir = "/tmp/run";
  env.restart_count = 2;
  env.threads = 3;
  env.resume = true;
  env.device = "cuda:1";
  for (const auto& kv : run::worker_env_assignments(env)) {
    const auto eq = kv.find('=');
    ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  const auto back = run::worker_env_from_environment();
  CHECK(back.rank == 3);
  CHECK(back.local_rank == 1);
  CHECK(back.world_size == 4);
  CHECK(back.local_world_size == 2);
  CHECK(back.group_rank == 1);
  CHECK(back.master_addr == "10.1.2.3");
  CHECK(back.master_port == 29500);
  CHECK(back.run_id == "abc");
  CHECK(back.run_dir == "/tmp/run");
  CHECK(back.restart_count == 2);
  CHECK(back.threads == 3);
  CHECK(back.resume);
  CHECK(back.device == "cuda:1");
  CHECK(std::string(std::getenv("OMP_NUM_THREADS")) == "3");

  SECTION("a missing variable is named") {
    ::unsetenv("MASTER_ADDR");
    CHECK_THROWS_WITH(run::worker_env_from_environment(), Catch::Contains("MASTER_ADDR is not set"));
  }
  SECTION("a malformed one too") {
    ::setenv("WORLD_SIZE", "two", 1);
    CHECK_THROWS_WITH(run::worker_env_from_environment(), Catch::Contains("WORLD_SIZE='two' is not an integer"));
  }
  SECTION("rank must be below world size") {
    ::setenv("RANK", "4", 1);
    CHECK_THROWS_WITH(run::worker_env_from_environment(), Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
  }
}

TEST_CASE("a rank started on its own finds its GPU and its threads as Slurm binds them (issue 25, defect 8)", "[launch]") {
  using launch::rank_device;
  CHECK(rank_device(0, 4, 0) == "cpu");
  CHECK(rank_device(2, 4, 4) == "cuda:2");  // --gpus-per-node / torchrun: every rank sees the node's GPUs
  CHECK(rank_device(3, 4, 1) == "cuda:0");  // --gpus-per-task=1: each task sees its own GPU as device 0
  CHECK(rank_device(0, 1, 1) == "cuda:0");
  CHECK(rank_device(3, 4, 2) == "cuda:3");  // neither: refused by name when opened
  ::unsetenv("OMP_NUM_THREADS");            // it would decide the threads (core_test checks that)
  launch::Topology slurm;
  slurm.mode = launch::Topology::Mode::kRank;
  slurm.source = "slurm";
  slurm.local_world_size = 4;
  CHECK(launch::rank_threads(0, slurm, 4, 16) == 4);   // srun --cpus-per-task=4 bound the task: its 4 cores are its own
  CHECK(launch::rank_threads(0, slurm, 16, 16) == 4);  // no binding: the node's 16 cores shared by 4 ranks
  CHECK(launch::rank_threads(3, slurm, 4, 16) == 3);   // the recipe's launch.threads_per_worker wins
  launch::Topology torchrun = slurm;
  torchrun.source = "torchrun";
  CHECK(launch::rank_threads(0, torchrun, 8, 16) == 2);  // a job's cpuset shared by its ranks: divided
}
