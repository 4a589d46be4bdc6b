// Checkpoints edited, damaged or crowded by other files (issue 20): every one is a checkpoint
// error that resume's fallback handles, never a crash, an exception of another kind, or weights
// loaded from the wrong bytes; names dstrain did not write are never touched.
#include "catch_torch.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <map>
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

using Edits = std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>>;

// Each edit of a fresh checkpoint (made by `save` under a root) is a checkpoint error, and
// inspect-ckpt's reader reports it instead of throwing another kind of exception.
void expect_refused(const Edits& cases, const std::function<std::string(const std::string&)>& save) {
  for (const auto& [what, edit] : cases) {
    test::TempDir tmp;
    const std::string dir = save(tmp.path());
    edit_manifest(dir, edit, true);
    INFO(what);
    CHECK_FALSE(load_error(dir).empty());
    try {
      (void)ckpt::inspect_checkpoint(dir);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kCheckpoint);
    }
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
  const Edits cases{
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
      // Numbers that are not integers: nlohmann's cast of a float out of range is undefined (manifest_fuzz).
      {"tokens_consumed 1e40", [](nlohmann::json& m) { m["tokens_consumed"] = 1e40; }},
      {"a step of 2.5", [](nlohmann::json& m) { m["step"] = 2.5; }},
      {"a shape of 1e30", [](nlohmann::json& m) { m["tensors"][0]["shape"] = {1e30}; }},
      {"a crc32c above 2^32", [](nlohmann::json& m) { m["files"][0]["crc32c"] = uint64_t{1} << 40; }},
      {"a start of -1e300", [](nlohmann::json& m) { m["tensors"][0]["pieces"][0]["start"] = -1e300; }},
  };
  expect_refused(cases, [](const std::string& root) { return save_step(root, 1); });
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

namespace {

// A format-3 checkpoint written as the engine writes one: tensors a, b, c (and their "m."
// moments) in two units over 3 ranks, placed by the shard table; rank 0's file ends with a
// replicated tensor. Element i of tensor T holds value_of(T, i).
float value_of(const std::string& tensor, int64_t i) { return static_cast<float>(tensor.size() * 100 + tensor.back() * 10) + i; }

std::string save_sharded(const std::string& root) {
  ckpt::ShardTable table;
  table.ranks = 3;
  table.prefixes = {"", "m."};
  table.units = {{4, {{"a", 0, 5}, {"b", 5, 7}}}, {2, {{"c", 0, 4}}}};
  std::vector<ckpt::TensorMeta> metas;
  for (const auto& prefix : table.prefixes)
    for (const auto& u : table.units)
      for (const auto& p : u.params) metas.push_back({prefix + p.name, "float32", {p.numel}});
  metas.push_back({"rep", "float32", {3}});
  std::map<std::string, std::vector<float>> values;
  for (const auto& m : metas)
    for (int64_t i = 0; i < m.numel(); ++i) values[m.name].push_back(value_of(m.name, i));
  const std::string staging = ckpt::prepare_staging(root, 7);
  std::vector<ckpt::ShardFile> files;
  for (int r = 0; r < 3; ++r) {
    std::vector<ckpt::PieceView> pieces;
    for (const auto& prefix : table.prefixes)
      for (const auto& u : table.units)
        for (const auto& p : u.params) {
          const int64_t a = std::max<int64_t>(r * u.chunk, p.offset), b = std::min<int64_t>((r + 1) * u.chunk, p.offset + p.numel);
          if (a < b) pieces.push_back({prefix + p.name, a - p.offset, b - a, values[prefix + p.name].data() + (a - p.offset)});
        }
    if (r == 0) pieces.push_back({"rep", 0, 3, values["rep"].data()});
    ckpt::ShardFile f = ckpt::write_shard(staging, r, metas, pieces);
    f.pieces.erase(std::remove_if(f.pieces.begin(), f.pieces.end(), [](const ckpt::Piece& p) { return p.tensor != "rep"; }),
                   f.pieces.end());
    files.push_back(f);
  }
  ckpt::TrainState state;
  state.step = 7, state.world_size = 3, state.config_hash = "abc";
  return ckpt::commit(root, state, metas, files, {}, &table);
}

}  // namespace

TEST_CASE("format 3: the shard table places every rank's shards, and the manifest lists no per-rank pieces", "[ckpt]") {
  test::TempDir tmp;
  const std::string dir = save_sharded(tmp.path());
  const nlohmann::json m = nlohmann::json::parse(read_file(dir + "/manifest.json"));
  CHECK(m["format_version"] == 3);
  CHECK(m["shards"]["ranks"] == 3);
  for (const auto& t : m["tensors"]) CHECK((t["name"] == "rep" ? t["pieces"].is_array() : t["pieces"] == "shards"));
  const ckpt::Reader reader(dir);
  reader.verify();
  for (const auto& t : reader.tensors()) {
    std::vector<float> got(static_cast<size_t>(t.numel()));
    reader.read(t.name, 0, t.numel(), got.data(), "float32");
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(got[static_cast<size_t>(i)] == value_of(t.name, i));
    if (t.numel() > 2) {  // a range across chunk boundaries
      std::vector<float> part(2);
      reader.read(t.name, t.numel() - 3, 2, part.data(), "float32");
      CHECK(part[0] == value_of(t.name, t.numel() - 3));
      CHECK(part[1] == value_of(t.name, t.numel() - 2));
    }
  }
  const ckpt::Inspection in = ckpt::inspect_checkpoint(dir);
  CHECK(in.manifest_problem.empty());
  CHECK(in.files_of_tensor.at("m.b") == std::vector<std::string>{"rank_00001.bin", "rank_00002.bin"});
  CHECK(in.files_of_tensor.at("c") == std::vector<std::string>{"rank_00000.bin", "rank_00001.bin"});
}

TEST_CASE("format 3: a hostile shard table is a checkpoint error", "[ckpt]") {
  const Edits cases{
      {"0 ranks", [](nlohmann::json& m) { m["shards"]["ranks"] = 0; }},
      {"2^40 ranks", [](nlohmann::json& m) { m["shards"]["ranks"] = int64_t{1} << 40; }},
      {"4 ranks (no 4th file)", [](nlohmann::json& m) { m["shards"]["ranks"] = 4; }},
      {"chunk 0", [](nlohmann::json& m) { m["shards"]["units"][0]["chunk"] = 0; }},
      {"chunk 2^60", [](nlohmann::json& m) { m["shards"]["units"][0]["chunk"] = int64_t{1} << 60; }},
      {"a chunk larger than the files", [](nlohmann::json& m) { m["shards"]["units"][1]["chunk"] = 3; }},
      {"overlapping parameters", [](nlohmann::json& m) { m["shards"]["units"][0]["params"][1][1] = 4; }},
      {"a parameter past its unit", [](nlohmann::json& m) { m["shards"]["units"][1]["params"][0][1] = 9; }},
      {"a size that is not the tensor's", [](nlohmann::json& m) { m["shards"]["units"][0]["params"][0][2] = 4; }},
      {"an unknown tensor", [](nlohmann::json& m) { m["shards"]["units"][0]["params"][0][0] = "z"; }},
      {"a tensor placed twice",
       [](nlohmann::json& m) {
         m["shards"]["prefixes"] = {"", ""};
       }},
      {"a marked tensor the table misses", [](nlohmann::json& m) { m["shards"]["prefixes"] = {""}; }},
      {"\"shards\" without a table", [](nlohmann::json& m) { m.erase("shards"); }},
      {"a mistyped table", [](nlohmann::json& m) { m["shards"]["units"][0]["params"][0] = "a"; }},
      {"format 5", [](nlohmann::json& m) { m["format_version"] = 5; }},
  };
  expect_refused(cases, save_sharded);
}

TEST_CASE("format 4: a hostile base record is a checkpoint error", "[ckpt]") {
  const auto with_base = [](const std::string& root) {
    static const std::vector<float> a{1, 2, 3, 4};
    ckpt::TrainState state;
    state.step = 1, state.world_size = 1, state.config_hash = "abc";
    state.base = {"/models/base", {{"model.safetensors", 64, 0x1234}}};
    return ckpt::save_checkpoint(root, state, {{"w.lora_A.weight", "float32", {4}, a.data(), a.size() * 4}}, {});
  };
  const Edits cases{
      {"no files", [](nlohmann::json& m) { m["base"]["files"] = nlohmann::json::array(); }},
      {"an empty path", [](nlohmann::json& m) { m["base"]["path"] = ""; }},
      {"a number for a path", [](nlohmann::json& m) { m["base"]["path"] = 3; }},
      {"a negative size", [](nlohmann::json& m) { m["base"]["files"][0]["bytes"] = -1; }},
      {"a checksum past 32 bits", [](nlohmann::json& m) { m["base"]["files"][0]["crc32c"] = int64_t{1} << 40; }},
      {"a file without a name", [](nlohmann::json& m) { m["base"]["files"][0].erase("name"); }},
  };
  expect_refused(cases, with_base);
}
