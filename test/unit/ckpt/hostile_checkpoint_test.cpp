// Checkpoints edited, damaged or crowded by other files (issue 20): every one is a checkpoint
// error that resume's fallback handles, never a crash, an exception of another kind, or weights
// loaded from the wrong bytes; names dstrain did not write are never touched.
#include "catch_torch.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace dstrain;

namespace {

std::string save_step(const std::string& root, int64_t step, ckpt::Retention retention = {}) {
  static const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{7, 8, 9, 10};
  ckpt::TrainState state;
  state.step = step, state.samples_consumed = step * 16, state.world_size = 1, state.config_hash = "abc";
  return ckpt::save_checkpoint(
      root, state, {{"w.a", "float32", {2, 3}, a.data(), a.size() * 4}, {"w.b", "float32", {4}, b.data(), b.size() * 4}}, retention);
}

// Rewrites DIR's manifest through `edit`; with `recommit`, COMMITTED loses its checksum line (as
// an older dstrain wrote it), so that the manifest's own checks must catch the edit.
void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit, bool recommit) {
  const std::string path = dir + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(read_file(path));
  edit(m);
  write_file_atomic(path, m.dump(1) + "\n");
  if (recommit) write_file_atomic(dir + "/COMMITTED", "step 1\n");
}

// The error a Reader (and a verify) gives for DIR, or "" when it loads.
std::string load_error(const std::string& dir) {
  try {
    ckpt::Reader reader(dir);
    reader.verify();
    return "";
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCheckpoint);
    return e.what();
  }
}

}  // namespace

TEST_CASE("a manifest edited after the commit is refused by the checksum in COMMITTED", "[ckpt]") {
  test::TempDir tmp;
  const std::string dir = save_step(tmp.path(), 1);
  CHECK(read_file(dir + "/COMMITTED").find("manifest crc32c ") != std::string::npos);
  CHECK(load_error(dir).empty());
  edit_manifest(
      dir, [](nlohmann::json& m) { m["tensors"][0]["pieces"][0]["offset"] = 4; }, false);
  CHECK_THAT(load_error(dir), Catch::Contains("changed after the save"));
}

TEST_CASE("a checkpoint without the checksum still has its pieces tile every file exactly", "[ckpt]") {
  test::TempDir tmp;
  const std::string dir = save_step(tmp.path(), 1);
  // The audit's attack: a piece shifted by 4 bytes would load shifted weights.
  edit_manifest(
      dir, [](nlohmann::json& m) { m["tensors"][1]["pieces"][0]["offset"] = m["tensors"][1]["pieces"][0]["offset"].get<int>() - 4; }, true);
  CHECK_THAT(load_error(dir), Catch::Contains("in two pieces"));
  const std::string again = save_step(tmp.path() + "/b", 1);
  edit_manifest(
      again, [](nlohmann::json& m) { m["files"][0]["bytes"] = m["files"][0]["bytes"].get<int>() + 8; }, true);
  CHECK_THAT(load_error(again), Catch::Contains("in no piece"));
}

TEST_CASE("impossible shapes, dtypes, counts and file names are checkpoint errors", "[ckpt]") {
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases{
      {"a huge shape", [](nlohmann::json& m) { m["tensors"][0]["shape"] = {(int64_t{1} << 62) + 1}; }},
      {"a negative shape",
       [](nlohmann::json& m) {
         m["tensors"][0]["shape"] = {-1, -32768};
       }},
      {"dtype int4", [](nlohmann::json& m) { m["tensors"][0]["dtype"] = "int4"; }},
      {"count -1", [](nlohmann::json& m) { m["tensors"][0]["pieces"][0]["count"] = -1; }},
      {"an offset near 2^64", [](nlohmann::json& m) { m["tensors"][0]["pieces"][0]["offset"] = ~uint64_t{0} - 3; }},
      {"file name .",
       [](nlohmann::json& m) {
         m["files"][0]["name"] = ".";
         m["tensors"][0]["pieces"][0]["file"] = ".";
         m["tensors"][1]["pieces"][0]["file"] = ".";
       }},
      {"file name ../x", [](nlohmann::json& m) { m["files"][0]["name"] = "../x"; }},
  };
  for (const auto& [what, edit] : cases) {
    test::TempDir tmp;
    const std::string dir = save_step(tmp.path(), 1);
    edit_manifest(dir, edit, true);
    INFO(what);
    CHECK_FALSE(load_error(dir).empty());
    // inspect-ckpt's reader reports instead of throwing another kind of exception
    try {
      (void)ckpt::inspect_checkpoint(dir);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kCheckpoint);
    }
  }
}

TEST_CASE("resume falls back past a checkpoint whose manifest names a directory", "[ckpt]") {
  test::TempDir tmp;
  save_step(tmp.path(), 1);
  const std::string newest = save_step(tmp.path(), 2);
  edit_manifest(
      newest, [](nlohmann::json& m) { m["files"][0]["name"] = "."; }, true);
  std::vector<std::string> skipped;
  const auto chosen = ckpt::usable_checkpoint(tmp.path(), &skipped);
  REQUIRE(chosen);
  CHECK(fs::path(*chosen).filename() == "step_00000001");
  CHECK(skipped.size() == 1);
}

TEST_CASE("pruning and resume touch only the names dstrain writes", "[ckpt]") {
  test::TempDir tmp;
  save_step(tmp.path(), 50, {1, 0});
  fs::copy(tmp.path() + "/step_00000050", tmp.path() + "/step_00000050.bak", fs::copy_options::recursive);  // a user's copy
  fs::create_directories(tmp.path() + "/step_old");
  write_file_atomic(tmp.path() + "/step_old/COMMITTED", "step 0\n");
  save_step(tmp.path(), 60, {1, 0});  // prunes step 50: no exception from the stray names
  save_step(tmp.path(), 70, {1, 0});
  CHECK(fs::exists(tmp.path() + "/step_00000050.bak/manifest.json"));
  CHECK(fs::exists(tmp.path() + "/step_old"));
  CHECK_FALSE(fs::exists(tmp.path() + "/step_00000060"));
  CHECK(fs::path(*ckpt::usable_checkpoint(tmp.path())).filename() == "step_00000070");
}

TEST_CASE("saving a step again swaps the new copy in before the old one goes", "[ckpt]") {
  test::TempDir tmp;
  const std::string first = save_step(tmp.path(), 5);
  const std::string manifest_before = read_file(first + "/manifest.json");
  const std::string again = save_step(tmp.path(), 5);
  CHECK(again == first);
  CHECK(fs::exists(again + "/COMMITTED"));
  CHECK(load_error(again).empty());
  CHECK(fs::path(*ckpt::latest_checkpoint(tmp.path())).filename() == "step_00000005");
  for (const auto& e : fs::directory_iterator(tmp.path()))  // no staging or old copy left behind
    CHECK(e.path().filename().string().find(".partial") == std::string::npos);
  (void)manifest_before;
}
