#include "catch_torch.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dstrain/ckpt/base_model.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace dstrain;

namespace {

// Writes `bytes` into dir/name, its modification time a second past the last one (a checksum
// cache keyed by the file's identity must see the change).
void put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  const fs::path path = dir / name;
  const bool existed = fs::exists(path);
  const auto before = existed ? fs::last_write_time(path) : fs::file_time_type{};
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  if (existed) fs::last_write_time(path, before + std::chrono::seconds(1));
}

}  // namespace

TEST_CASE("a base is its weight files' names, sizes and CRC-32C, in name order", "[ckpt]") {
  test::TempDir tmp;
  put(tmp.path(), "model-00002-of-00002.safetensors", "second shard");
  put(tmp.path(), "model-00001-of-00002.safetensors", "first shard bytes");
  put(tmp.path(), "config.json", "{}");  // not weights: a transformers upgrade may rewrite it
  const ckpt::BaseModel base = ckpt::identify_base(tmp.path());
  CHECK(base.path == fs::path(tmp.path()).lexically_normal().string());
  REQUIRE(base.files.size() == 2);
  CHECK(base.files[0].name == "model-00001-of-00002.safetensors");
  CHECK(base.files[0].bytes == 17);
  CHECK(base.files[0].crc32c == crc32c("first shard bytes", 17));
  CHECK(base.files[1].crc32c == crc32c("second shard", 12));
  CHECK(ckpt::base_difference(base, ckpt::identify_base(tmp.path())).empty());
  const ckpt::BaseModel back = ckpt::base_model_from_json(ckpt::to_json(base));
  CHECK(back.path == base.path);
  CHECK(ckpt::base_difference(base, back).empty());
}

TEST_CASE("another base is named by its first differing file", "[ckpt]") {
  test::TempDir tmp;
  put(tmp.path(), "a.safetensors", "weights of a");
  put(tmp.path(), "b.safetensors", "weights of b");
  const ckpt::BaseModel then = ckpt::identify_base(tmp.path());

  put(tmp.path(), "b.safetensors", "weights of B");  // one byte, the same size
  ckpt::BaseModel now = ckpt::identify_base(tmp.path());
  CHECK_THAT(ckpt::base_difference(then, now), Catch::Contains("b.safetensors: CRC-32C") && Catch::Contains("the checkpoint's base had"));
  now.path = "/elsewhere";
  CHECK_THROWS_WITH(ckpt::check_checkpoint_base("run/ckpt/step_00000010", then, now),
                    Catch::Contains("checkpoint run/ckpt/step_00000010 holds adapters trained on the base " + then.path) &&
                        Catch::Contains("b.safetensors"));
  try {
    ckpt::check_checkpoint_base("c", then, now);
    FAIL("another base was taken");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCheckpoint);
    CHECK_THAT(e.hint(), Catch::Contains("set model.init_from to the base the adapters belong to (" + then.path + ": 2 files)"));
  }

  CHECK_THROWS_WITH(ckpt::check_checkpoint_base("c", then, ckpt::identify_base(tmp.path())),
                    Catch::Contains("holds adapters trained on the base " + then.path + ", whose files have changed since: b.safetensors"));
  put(tmp.path(), "b.safetensors", "weights of b, longer");
  now = ckpt::identify_base(tmp.path());
  CHECK_THAT(ckpt::base_difference(then, now), Catch::Contains("b.safetensors: 20 bytes, the checkpoint's base had 12"));
  fs::remove(fs::path(tmp.path()) / "b.safetensors");
  CHECK_THAT(ckpt::base_difference(then, ckpt::identify_base(tmp.path())),
             Catch::Contains("b.safetensors of the checkpoint's base is missing"));
  put(tmp.path(), "b.safetensors", "weights of b");
  put(tmp.path(), "c.safetensors", "more");
  CHECK_THAT(ckpt::base_difference(then, ckpt::identify_base(tmp.path())),
             Catch::Contains("c.safetensors is not a file of the checkpoint's base"));

  // The same files elsewhere are the same base (a moved folder).
  test::TempDir moved;
  put(moved.path(), "a.safetensors", "weights of a");
  put(moved.path(), "b.safetensors", "weights of b");
  CHECK(ckpt::base_difference(then, ckpt::identify_base(moved.path())).empty());
}

TEST_CASE("a folder without weight files is no base", "[ckpt]") {
  test::TempDir tmp;
  put(tmp.path(), "config.json", "{}");
  CHECK_THROWS_WITH(ckpt::identify_base(tmp.path()), Catch::Contains("holds no .safetensors file"));
  CHECK_THROWS_AS(ckpt::identify_base(tmp.path() + "/absent"), Error);
}

TEST_CASE("a checkpoint that names its base is format 4 and reads its base back; one that does not stays format 3", "[ckpt]") {
  test::TempDir tmp;
  static const std::vector<float> a{1, 2, 3, 4};
  ckpt::TrainState state;
  state.step = 3, state.world_size = 1, state.config_hash = "abc";
  const auto save = [&](const std::string& root) {
    return ckpt::save_checkpoint(root, state, {{"x.lora_A.weight", "float32", {4}, a.data(), a.size() * 4}}, {});
  };
  const std::string plain = save(tmp.path() + "/plain");
  CHECK(nlohmann::json::parse(read_file(plain + "/manifest.json"))["format_version"] == 3);
  CHECK(ckpt::Reader(plain).state().base.empty());

  state.base = {"/models/deepseek-coder", {{"model.safetensors", 2048, 0xdeadbeef}}};
  const std::string named = save(tmp.path() + "/named");
  const nlohmann::json m = nlohmann::json::parse(read_file(named + "/manifest.json"));
  CHECK(m["format_version"] == 4);
  CHECK(m["base"]["path"] == "/models/deepseek-coder");
  const ckpt::Reader reader(named);
  CHECK(reader.state().base.path == "/models/deepseek-coder");
  CHECK(ckpt::base_difference(state.base, reader.state().base).empty());
  CHECK(ckpt::inspect_checkpoint(named).state.base.files.at(0).crc32c == 0xdeadbeef);
}
