// One process per run directory (issue 20): a second train or resume of a run that is still
// running is refused at once, naming the holder; the lock goes with the holder.
#include "catch_torch.h"

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "dstrain/core/error.h"
#include "dstrain/run/run_lock.h"
#include "test_support.h"

using namespace dstrain;

TEST_CASE("a run directory is locked by one process at a time, per node", "[launch]") {
  test::TempDir dir;
  const std::string run = dir.path() + "/run";
  std::optional<run::RunDirLock> first;
  first.emplace(run);
  try {
    run::RunDirLock second(run);
    FAIL("a second lock was granted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUsage);
    CHECK_THAT(e.what(), Catch::Contains("is in use by pid " + std::to_string(::getpid())));
    CHECK_THAT(e.hint(), Catch::Contains("choose another run_dir"));
  }
  run::RunDirLock node1(run, 1);  // another node's launcher on a shared filesystem
  first.reset();
  run::RunDirLock again(run);  // released with its holder
  CHECK(std::filesystem::exists(run + "/.lock"));
}
