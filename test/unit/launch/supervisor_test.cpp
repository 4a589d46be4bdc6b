// The supervisor blames the cause, not the symptom (issue 20): a peer's communication error
// that comes first is the usual echo of a crash reaped a moment later.
#include "catch_torch.h"

#include <string>

#include "dstrain/core/exit_code.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/run/worker_env.h"
#include "test_support.h"

using namespace dstrain;

namespace {

// Two workers running `script` in /bin/sh, with RANK set as for real workers.
launch::WorkerFailure supervise_script(const std::string& script, const std::string& log_dir, int* status) {
  launch::SupervisorOptions o;
  o.executable = "/bin/sh";
  o.worker_args = {"-c", script};
  o.log_dir = log_dir;
  for (int r = 0; r < 2; ++r) {
    run::WorkerEnv env;
    env.rank = r, env.local_rank = r, env.world_size = 2, env.local_world_size = 2;
    o.workers.push_back(env);
  }
  launch::WorkerFailure failure;
  *status = launch::supervise(o, &failure);
  return failure;
}

}  // namespace

TEST_CASE("a crash reaped after a peer's communication error is blamed, not the peer", "[launch]") {
  test::TempDir dir;
  int status = 0;
  // Rank 0 reports a communication error at once; rank 1 crashes 0.3 s later.
  const auto failure = supervise_script("if [ \"$RANK\" = 0 ]; then exit 6; else sleep 0.3; kill -SEGV $$; fi", dir.path() + "/a", &status);
  CHECK(failure.rank == 1);
  CHECK(failure.signal == 11);
  CHECK(status == exit_status::kWorkerFailed);
}

TEST_CASE("a communication error with nothing behind it is still reported, after the window", "[launch]") {
  test::TempDir dir;
  int status = 0;
  const auto failure = supervise_script("if [ \"$RANK\" = 0 ]; then exit 6; else exec sleep 30; fi", dir.path() + "/b", &status);
  CHECK(failure.rank == 0);
  CHECK(failure.exit_code == 6);
  CHECK(status == exit_status::kComm);
}
