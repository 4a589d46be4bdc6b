#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <string>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
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
  CHECK(threads_per_worker(0, 2, 2) == 1);
  CHECK(threads_per_worker(0, 1, 2) == 2);
  CHECK(threads_per_worker(0, 4, 16) == 4);
  CHECK(threads_per_worker(0, 8, 2) == 1);  // never zero
  CHECK(threads_per_worker(3, 8, 2) == 3);  // the recipe wins
  CHECK(online_cores() >= 1);
}

TEST_CASE("the README's exit code table matches the code", "[core]") {
  const std::string readme = read_file(test::source_dir() + "/README.md");
  const std::vector<std::pair<ErrorCode, int>> expected = {
      {ErrorCode::kUsage, 2},       {ErrorCode::kConfig, 2}, {ErrorCode::kData, 3},         {ErrorCode::kCheckpoint, 4},
      {ErrorCode::kEnvironment, 5}, {ErrorCode::kComm, 6},   {ErrorCode::kWorkerFailed, 7}, {ErrorCode::kInterrupted, 130},
      {ErrorCode::kInternal, 1}};
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
  CHECK(dstrain::first_line("DefaultCPUAllocator: can't allocate memory\nException raised from ...\nframe #0") == "DefaultCPUAllocator: can't allocate memory");
  CHECK(dstrain::first_line("one line") == "one line");
  CHECK(dstrain::first_line("") == "");
}
