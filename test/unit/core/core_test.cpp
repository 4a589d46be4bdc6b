#include "catch_torch.h"

#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/core/open_files.h"
#include "dstrain/core/sha256.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/run/progress_line.h"
#include "dstrain/core/threads.h"
#include "test_support.h"

using namespace dstrain;

TEST_CASE("crc32c matches the standard check value", "[core]") {
  const std::string check = "123456789";
  CHECK(crc32c(check.data(), check.size()) == 0xE3069283u);
  // Incremental use gives the same value as one pass.
  CHECK(crc32c(check.data() + 4, 5, crc32c(check.data(), 4)) == 0xE3069283u);
  CHECK(crc32c(nullptr, 0) == 0u);
  // The 8-bytes-at-a-time hardware path agrees with the table, one byte at a time.
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  uint32_t chained = 0;
  for (char ch : big) chained = crc32c(&ch, 1, chained);
  CHECK(crc32c(big.data(), big.size()) == chained);
}

TEST_CASE("atomic writes replace whole files and leave no temporaries", "[core]") {
  test::TempDir dir;
  const std::string path = dir.path() + "/f.json";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second, longer");
  CHECK(read_file(path) == "second, longer");
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK_THROWS_AS(write_file_atomic(dir.path() + "/missing/dir/f", "x"), Error);
  CHECK_THROWS_WITH(read_file(dir.path() + "/absent"), Catch::Contains("absent"));
}

TEST_CASE("threads are divided among local workers", "[core]") {
  ::unsetenv("OMP_NUM_THREADS");
  CHECK(threads_per_worker(0, 2, 2) == 1);
  CHECK(threads_per_worker(0, 1, 2) == 2);
  CHECK(threads_per_worker(0, 4, 16) == 4);
  CHECK(threads_per_worker(0, 8, 2) == 1);  // never zero
  CHECK(threads_per_worker(3, 8, 2) == 3);  // the recipe wins
  CHECK(online_cores() >= 1);
}

TEST_CASE("OMP_NUM_THREADS from the environment is honoured as torchrun does, and an override of it is said", "[core]") {
  const ThreadCount omp = worker_threads(0, 2, 16, "3");
  CHECK(omp.threads == 3);
  CHECK(omp.why == "OMP_NUM_THREADS=3 from the environment");
  CHECK(omp.warning.empty());
  const ThreadCount recipe = worker_threads(4, 2, 16, "3");
  CHECK(recipe.threads == 4);
  CHECK(recipe.warning == "OMP_NUM_THREADS=3 in the environment is overridden by launch.threads_per_worker=4");
  CHECK(worker_threads(3, 2, 16, "3").warning.empty());
  const ThreadCount unset = worker_threads(0, 2, 16, nullptr);
  CHECK(unset.threads == 8);
  CHECK(unset.why == "16 cores / 2 local workers");
  for (const char* bad : {"", "0", "two", "4x", "-1"}) {
    const ThreadCount t = worker_threads(0, 2, 16, bad);
    CHECK(t.threads == 8);
    if (*bad) CHECK_THAT(t.warning, Catch::Contains("is not a thread count"));
  }
}

TEST_CASE("the README's exit code table matches the code", "[core]") {
  const std::string readme = read_file(test::source_dir() + "/README.md");
  const std::vector<std::pair<ErrorCode, int>> expected = {
      {ErrorCode::kUsage, 2},        {ErrorCode::kConfig, 2},        {ErrorCode::kData, 3},
      {ErrorCode::kCheckpoint, 4},   {ErrorCode::kEnvironment, 5},   {ErrorCode::kComm, 6},
      {ErrorCode::kWorkerFailed, 7}, {ErrorCode::kInterrupted, 130}, {ErrorCode::kInternal, 1}};
  for (const auto& [code, status] : expected) {
    CHECK(exit_status_for(code) == status);
    INFO("README row for exit status " << status);
    CHECK(std::regex_search(readme, std::regex("\\|\\s*" + std::to_string(status) + "\\s*\\|")));
  }
  for (int status : {exit_status::kDiverged, exit_status::kStopped}) {
    INFO("README row for exit status " << status);
    CHECK(std::regex_search(readme, std::regex("\\|\\s*" + std::to_string(status) + "\\s*\\|")));
  }
}

TEST_CASE("first_line keeps what a message quotes of a library's exception text", "[core]") {
  CHECK(dstrain::first_line("DefaultCPUAllocator: can't allocate memory\nException raised from ...\nframe #0") ==
        "DefaultCPUAllocator: can't allocate memory");
  CHECK(dstrain::first_line("one line") == "one line");
  CHECK(dstrain::first_line("") == "");
}

TEST_CASE("fault injector: parses every fault and answers no fault otherwise", "[core]") {
  dstrain::FaultInjector none("");
  CHECK_FALSE(none.any());
  CHECK_FALSE(none.overflow_at(3));
  CHECK_FALSE(none.nan_loss_due(0, 1));
  CHECK(none.stall_seconds(0, 1) == 0);
  CHECK(none.slowdown(0) == 1);
  CHECK(none.offload_chunk(77) == 77);
  CHECK_FALSE(none.fact_override(0));
  CHECK(none.data_path_override(0).empty());

  dstrain::FaultInjector f(
      "inf_step=3;nan_loss=1:12;stall=1:4:2.5;slow_rank=1:3;offload_chunk=5000;fact=2:libtorch=2.10.0;data_path=2:/a:b/c");
  CHECK(f.any());
  CHECK(f.overflow_at(3));
  CHECK_FALSE(f.overflow_at(4));
  CHECK_FALSE(f.nan_loss_due(0, 12));
  CHECK(f.nan_loss_due(1, 12));
  CHECK_FALSE(f.nan_loss_due(1, 12));  // once per process: a transient fault
  CHECK(f.stall_seconds(1, 4) == 2.5);
  CHECK(f.stall_seconds(1, 5) == 0);
  CHECK(f.slowdown(1) == 3);
  CHECK(f.offload_chunk(77) == 5000);
  REQUIRE(f.fact_override(2));
  CHECK(f.fact_override(2)->first == "libtorch");
  CHECK(f.fact_override(2)->second == "2.10.0");
  CHECK(f.data_path_override(2) == "/a:b/c");

  dstrain::FaultInjector always("nan_loss=0:5:always");
  CHECK(always.nan_loss_due(0, 5));
  CHECK(always.nan_loss_due(0, 5));
}

TEST_CASE("fault injector: a malformed or unknown fault is an error that names it", "[core]") {
  for (const char* spec : {"stall=1:4", "nan_loss=1:x", "inf_step=3x", "fact=2:libtorch", "nan_loss=1:2:sometimes", "crash=3"}) {
    INFO(spec);
    try {
      dstrain::FaultInjector f(spec);
      FAIL("accepted");
    } catch (const dstrain::Error& e) {
      CHECK(e.code() == dstrain::ErrorCode::kUsage);
      CHECK_THAT(e.what(), Catch::Contains("DSTRAIN_TEST_FAULTS"));
    }
  }
}

TEST_CASE("progress lines: the worker's record reads back as written, other lines are not progress", "[core]") {
  const run::ProgressLine p{17, 10, 150, 2.345678, 12345.6, 3.25};
  const std::string line = run::encode_line(p);
  CHECK(run::is_progress_line(line));
  const auto q = run::decode_line(line);
  REQUIRE(q);
  CHECK(q->step == 17);
  CHECK(q->first_step == 10);
  CHECK(q->total_steps == 150);
  CHECK(q->loss == Approx(2.345678));
  CHECK(q->tokens_per_s == Approx(12345.6));
  CHECK(q->elapsed_s == Approx(3.25));
  CHECK_FALSE(run::decode_line("@@progress 1 2"));
  CHECK_FALSE(run::decode_line("@@progress 1 0 10 2.0 5.0 1.0 trailing"));
  CHECK_FALSE(run::is_progress_line("step 17/150 | loss 2.3"));
}

TEST_CASE("SHA-256 and HMAC-SHA256 match the NIST and RFC 4231 vectors", "[core]") {
  CHECK(to_hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(to_hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(to_hex(sha256(std::string(1000000, 'a'))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(to_hex(sha256(std::string(55, 'x'))) != to_hex(sha256(std::string(56, 'x'))));  // the one- and two-block tails
  CHECK(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(digests_equal(sha256("a"), sha256("a")));
  CHECK_FALSE(digests_equal(sha256("a"), sha256("b")));
}

TEST_CASE("the open-files soft limit is raised to the hard limit (issue 26)", "[core]") {
  rlimit original{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &original) == 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < 600) return;  // nothing to lower here
  rlimit low = original;
  low.rlim_cur = 512;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  const OpenFilesLimit l = raise_open_files_limit();
  CHECK(l.before == 512);
  CHECK(l.soft == l.hard);
  rlimit now{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &now) == 0);
  CHECK(now.rlim_cur == original.rlim_max);
  CHECK(open_files_needed(16384) >= 16384);
  ::setrlimit(RLIMIT_NOFILE, &original);
}
