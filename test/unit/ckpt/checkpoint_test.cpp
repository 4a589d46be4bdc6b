#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace dstrain;

namespace {

std::vector<float> values(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.5f;
  return v;
}

std::string save_step(const std::string& root, int64_t step, const std::vector<float>& a, const std::vector<float>& b, ckpt::Retention retention = {}) {
  return ckpt::save_checkpoint(root, {step, step * 16, 2, "abc123"},
                               {{"w.a", "float32", {2, 3}, a.data(), a.size() * sizeof(float)},
                                {"w.b", "float32", {4}, b.data(), b.size() * sizeof(float)}},
                               retention);
}

}  // namespace

TEST_CASE("a saved checkpoint loads back byte for byte", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, -3.0f);
  const std::string dir = save_step(tmp.path(), 7, a, b);
  CHECK(fs::path(dir).filename() == "step_00000007");
  REQUIRE(ckpt::latest_checkpoint(tmp.path()) == dir);

  const ckpt::Checkpoint ck = ckpt::load_checkpoint(dir);
  CHECK(ck.state.step == 7);
  CHECK(ck.state.samples_consumed == 112);
  CHECK(ck.state.world_size == 2);
  CHECK(ck.state.config_hash == "abc123");
  REQUIRE(ck.tensors.size() == 2);
  CHECK(ck.tensors[0].name == "w.a");
  CHECK(ck.tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(ck.tensors[0].bytes.data(), a.data(), 24) == 0);
  CHECK(std::memcmp(ck.tensors[1].bytes.data(), b.data(), 16) == 0);
}

TEST_CASE("keep_last removes the oldest committed checkpoints only", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  for (int64_t step : {10, 20, 30, 40}) save_step(tmp.path(), step, a, b, {2, 0});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path()))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"step_00000030", "step_00000040"});
  CHECK(fs::path(*ckpt::latest_checkpoint(tmp.path())).filename() == "step_00000040");
}

TEST_CASE("keep_every keeps milestones beyond keep_last", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  for (int64_t step : {10, 20, 30, 40, 50}) save_step(tmp.path(), step, a, b, {1, 20});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path()))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"step_00000020", "step_00000040", "step_00000050"});
}

TEST_CASE("a flipped byte is reported as corruption", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  const std::string dir = save_step(tmp.path(), 3, a, b);
  {
    std::fstream f(dir + "/tensors.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("checksum mismatch"));
  const ckpt::Inspection in = ckpt::inspect_checkpoint(dir);
  REQUIRE(in.files.size() == 1);
  CHECK_FALSE(in.files[0].ok);
}

TEST_CASE("a truncated file or a missing marker is refused", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  const std::string dir = save_step(tmp.path(), 3, a, b);
  SECTION("truncated") {
    fs::resize_file(dir + "/tensors.bin", 10);
    CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("has 10 bytes, the manifest says 40"));
  }
  SECTION("no COMMITTED") {
    fs::remove(dir + "/COMMITTED");
    CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("no COMMITTED marker"));
    CHECK_THROWS_AS(ckpt::latest_checkpoint(tmp.path()), Error);
  }
  SECTION("manifest of another version") {
    std::ofstream(dir + "/manifest.json") << R"({"format":"dstrain-checkpoint","format_version":99})";
    CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("format_version 99 is not supported"));
  }
}

TEST_CASE("an interrupted save leaves the previous checkpoint as latest", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  save_step(tmp.path(), 5, a, b);
  // What a crash mid-save leaves: a temporary directory with partial content.
  fs::create_directories(tmp.path() + "/step_00000006.tmp999");
  std::ofstream(tmp.path() + "/step_00000006.tmp999/tensors.bin") << "partial";
  CHECK(fs::path(*ckpt::latest_checkpoint(tmp.path())).filename() == "step_00000005");
  save_step(tmp.path(), 7, a, b);  // the next save cleans the leftovers
  CHECK_FALSE(fs::exists(tmp.path() + "/step_00000006.tmp999"));
}
