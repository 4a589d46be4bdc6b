#include "catch_torch.h"

#include <cstdlib>

#include "dstrain/core/error.h"
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
