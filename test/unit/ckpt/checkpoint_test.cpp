#include "catch_torch.h"

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

std::string save_step(const std::string& root, int64_t step, const std::vector<float>& a, const std::vector<float>& b,
                      ckpt::Retention retention = {}) {
  ckpt::TrainState state;
  state.step = step, state.samples_consumed = step * 16, state.world_size = 2, state.config_hash = "abc123";
  return ckpt::save_checkpoint(
      root, state,
      {{"w.a", "float32", {2, 3}, a.data(), a.size() * sizeof(float)}, {"w.b", "float32", {4}, b.data(), b.size() * sizeof(float)}},
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
    std::fstream f(dir + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH(ckpt::load_checkpoint(dir),
                    Catch::Contains("checksum mismatch") && Catch::Contains("rank_00000.bin") && Catch::Contains("w.a"));
  const ckpt::Inspection in = ckpt::inspect_checkpoint(dir);
  REQUIRE(in.files.size() == 1);
  CHECK_FALSE(in.files[0].ok);
  CHECK_THAT(in.files[0].problem, Catch::Contains("holds w.a, w.b"));
}

TEST_CASE("a truncated file or a missing marker is refused", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  const std::string dir = save_step(tmp.path(), 3, a, b);
  SECTION("truncated") {
    fs::resize_file(dir + "/rank_00000.bin", 10);
    CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("has 10 bytes, the manifest says 40"));
  }
  SECTION("missing file") {
    fs::remove(dir + "/rank_00000.bin");
    CHECK_THROWS_WITH(ckpt::load_checkpoint(dir), Catch::Contains("rank_00000.bin: is missing (it holds w.a, w.b)"));
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
  // What a crash mid-save leaves: a staging directory with partial content.
  fs::create_directories(tmp.path() + "/step_00000006.partial");
  std::ofstream(tmp.path() + "/step_00000006.partial/rank_00000.bin") << "partial";
  CHECK(fs::path(*ckpt::latest_checkpoint(tmp.path())).filename() == "step_00000005");
  CHECK(fs::path(*ckpt::usable_checkpoint(tmp.path())).filename() == "step_00000005");
  save_step(tmp.path(), 7, a, b);  // the next save cleans the leftovers
  CHECK_FALSE(fs::exists(tmp.path() + "/step_00000006.partial"));
}

TEST_CASE("shards written by several ranks read back in any other partition", "[ckpt]") {
  test::TempDir tmp;
  // A 10-element tensor written by 3 "ranks" in uneven pieces, plus a replicated one by rank 0.
  std::vector<float> w(10);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 1.5f;
  std::vector<double> scalars{1.0, 2.0};
  const std::vector<ckpt::TensorMeta> metas{{"w", "float32", {2, 5}}, {"s", "float64", {2}}};
  const std::string staging = ckpt::prepare_staging(tmp.path(), 4);
  std::vector<ckpt::ShardFile> files;
  files.push_back(ckpt::write_shard(staging, 0, metas, {{"w", 0, 3, w.data()}, {"s", 0, 2, scalars.data()}}));
  files.push_back(ckpt::write_shard(staging, 1, metas, {{"w", 3, 4, w.data() + 3}}));
  files.push_back(ckpt::shard_file_from_json(ckpt::to_json(ckpt::write_shard(staging, 2, metas, {{"w", 7, 3, w.data() + 7}}))));
  ckpt::TrainState state;
  state.step = 4, state.world_size = 3, state.zero_stage = 2, state.precision = "bf16";
  const std::string dir = ckpt::commit(tmp.path(), state, metas, files, {});
  const ckpt::Reader reader(dir);
  CHECK(reader.state().zero_stage == 2);
  CHECK(reader.state().precision == "bf16");
  CHECK_FALSE(reader.state().created.empty());
  // Read as 2 ranks would: [0, 5) and [5, 10), each spanning two files.
  std::vector<float> lo(5), hi(5);
  reader.read("w", 0, 5, lo.data(), "float32");
  reader.read("w", 5, 5, hi.data(), "float32");
  CHECK(std::vector<float>(w.begin(), w.begin() + 5) == lo);
  CHECK(std::vector<float>(w.begin() + 5, w.end()) == hi);
  std::vector<double> s2(2);
  reader.read("s", 0, 2, s2.data(), "float64");
  CHECK(s2 == scalars);
  CHECK_THROWS_WITH(reader.read("w", 0, 5, lo.data(), "float64"), Catch::Contains("tensor w is float32"));
  CHECK_THROWS_WITH(reader.read("nope", 0, 1, lo.data(), "float32"), Catch::Contains("has no tensor 'nope'"));
  // A gap in the pieces is a bug caught before anything is committed.
  const std::string staging2 = ckpt::prepare_staging(tmp.path(), 5);
  const auto only_part = ckpt::write_shard(staging2, 0, metas, {{"w", 0, 3, w.data()}, {"s", 0, 2, scalars.data()}});
  state.step = 5;
  CHECK_THROWS_WITH(ckpt::commit(tmp.path(), state, metas, {only_part}, {}), Catch::Contains("covered to 3 of 10"));
  CHECK(fs::path(*ckpt::latest_checkpoint(tmp.path())).filename() == "step_00000004");
}

TEST_CASE("resume falls back to the newest checkpoint that verifies", "[ckpt]") {
  test::TempDir tmp;
  const auto a = values(6, 1.0f), b = values(4, 2.0f);
  save_step(tmp.path(), 10, a, b);
  const std::string newest = save_step(tmp.path(), 20, a, b);
  fs::resize_file(newest + "/rank_00000.bin", 3);
  std::vector<std::string> skipped;
  const auto usable = ckpt::usable_checkpoint(tmp.path(), &skipped);
  REQUIRE(usable);
  CHECK(fs::path(*usable).filename() == "step_00000010");
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Catch::Contains("step_00000020/rank_00000.bin") && Catch::Contains("truncated"));
}
