// The Checkpointer in one process (ranks are threads): save at one world size and ZeRO stage,
// load at another, and compare with the run that was never interrupted.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "catch_torch.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/train/checkpointer.h"
#include "dstrain/zero/engine.h"
#include "engine_harness.h"
#include "test_support.h"

using namespace dstrain;
using dstrain::test::EngineRun;
using dstrain::test::EngineSpec;

namespace {

config::Recipe recipe_for(const EngineSpec& spec, bool async) {
  config::Recipe r;
  r.model = test::tiny_model_config();
  r.data.seq_len = 16;
  r.zero.stage = spec.stage;
  r.precision.dtype = spec.dtype;
  r.checkpoint.async = async;
  r.checkpoint.keep_last = 0;
  r.launch.timeout_s = 30;
  return r;
}

// A replicated tensor (as the trainer's data shares): saved by rank 0, loaded by every rank.
at::Tensor replicated_values() { return at::arange(5, at::kFloat) * 0.25; }

// Trains `first_steps`, saves (step, cursor = step x 8), then trains to spec.steps.
EngineRun save_midway(const EngineSpec& spec, const std::string& ckpt_dir, int64_t first_steps, bool async) {
  EngineRun record;
  const config::Recipe recipe = recipe_for(spec, async);
  comm::run_on_threads(spec.world, [&](comm::Communicator& comm) {
    const auto model = test::make_tiny_model(spec.dtype);
    zero::Engine engine(*model, comm, test::engine_options(spec));
    model::TensorState shares({{"data.shard_weights", replicated_values()}});
    train::Checkpointer checkpointer(recipe, ckpt_dir, comm, engine, {&shares}, "run1");
    test::train_steps(engine, *model, comm, spec, 0, first_steps, record);
    checkpointer.save(first_steps, first_steps * 8);
    test::train_steps(engine, *model, comm, spec, first_steps, spec.steps - first_steps, record);
    checkpointer.finish();
    test::gather_state(engine, comm, record);
  });
  return record;
}

struct Resumed {
  EngineRun run;
  int64_t step = 0, cursor = 0;
  at::Tensor replicated;
  at::Tensor master_at_load;
};

Resumed resume_and_finish(const EngineSpec& spec, const std::string& ckpt_dir) {
  Resumed out;
  const config::Recipe recipe = recipe_for(spec, false);
  comm::run_on_threads(spec.world, [&](comm::Communicator& comm) {
    const auto model = test::make_tiny_model(spec.dtype);
    zero::Engine engine(*model, comm, test::engine_options(spec));
    at::Tensor replicated = at::zeros({5}, at::kFloat);
    model::TensorState shares({{"data.shard_weights", replicated}});
    train::Checkpointer checkpointer(recipe, ckpt_dir, comm, engine, {&shares}, "run2");
    const train::Checkpointer::Resumed r = checkpointer.resume("");
    EngineRun at_load;
    test::gather_state(engine, comm, at_load);
    test::train_steps(engine, *model, comm, spec, r.step, spec.steps - r.step, out.run);
    test::gather_state(engine, comm, out.run);
    if (comm.rank() == 0)
      out.step = r.step, out.cursor = r.samples_consumed, out.replicated = replicated.clone(), out.master_at_load = at_load.master;
    if (comm.rank() == 1) CHECK(at::equal(replicated, replicated_values()));
  });
  return out;
}

std::vector<double> tail(const std::vector<double>& v, size_t from) { return {v.begin() + static_cast<std::ptrdiff_t>(from), v.end()}; }

}  // namespace

TEST_CASE("checkpointer: a resume at the same world size and stage is bit-identical", "[checkpointer]") {
  test::TempDir tmp;
  EngineSpec spec;
  spec.world = 2;
  spec.stage = 2;
  const EngineRun whole = save_midway(spec, tmp.path(), 2, /*async=*/false);
  const Resumed resumed = resume_and_finish(spec, tmp.path());
  CHECK(resumed.step == 2);
  CHECK(resumed.cursor == 16);
  CHECK(at::equal(resumed.replicated, replicated_values()));
  CHECK(resumed.run.losses == tail(whole.losses, 2));
  CHECK(at::equal(resumed.run.master, whole.master));
  CHECK(at::equal(resumed.run.exp_avg_sq, whole.exp_avg_sq));
}

TEST_CASE("checkpointer: saved by 2 ranks at stage 2, loaded by 1 rank at stage 0 and by 4 at stage 3", "[checkpointer]") {
  test::TempDir tmp;
  EngineSpec writer;
  writer.world = 2;
  writer.stage = 2;
  const EngineRun whole = save_midway(writer, tmp.path(), 2, /*async=*/false);
  EngineSpec two_steps = writer;
  two_steps.steps = 2;
  const EngineRun at_save = test::run_engine(two_steps);
  for (auto [world, stage] : {std::pair{1, 0}, std::pair{4, 3}, std::pair{4, 1}}) {
    DYNAMIC_SECTION(world << " rank(s), stage " << stage) {
      EngineSpec reader = writer;
      reader.world = world;
      reader.stage = stage;
      const Resumed resumed = resume_and_finish(reader, tmp.path());
      CHECK(at::equal(resumed.master_at_load, at_save.master));  // fp32 master weights restored exactly
      REQUIRE(resumed.run.losses.size() == 2);
      for (size_t i = 0; i < 2; ++i) CHECK(resumed.run.losses[i] == Approx(whole.losses[i + 2]).epsilon(2e-6));
      CHECK((resumed.run.master - whole.master).abs().max().item<double>() <= 2e-5);
    }
  }
}

TEST_CASE("checkpointer: an asynchronous save commits the same checkpoint", "[checkpointer]") {
  test::TempDir sync_dir, async_dir;
  EngineSpec spec;
  spec.world = 2;
  spec.stage = 3;
  save_midway(spec, sync_dir.path(), 2, /*async=*/false);
  save_midway(spec, async_dir.path(), 2, /*async=*/true);
  const auto sync_ckpt = ckpt::usable_checkpoint(sync_dir.path(), nullptr);
  const auto async_ckpt = ckpt::usable_checkpoint(async_dir.path(), nullptr);
  REQUIRE(sync_ckpt);
  REQUIRE(async_ckpt);
  const ckpt::Reader a(*sync_ckpt), b(*async_ckpt);
  a.verify();
  b.verify();
  CHECK(a.state().step == 2);
  CHECK(b.state().step == 2);
  const Resumed resumed = resume_and_finish(spec, async_dir.path());
  const Resumed reference = resume_and_finish(spec, sync_dir.path());
  CHECK(resumed.run.losses == reference.run.losses);
}

TEST_CASE("checkpointer: resuming with nothing committed names the directory", "[checkpointer]") {
  test::TempDir tmp;
  EngineSpec spec;
  spec.world = 2;
  try {
    resume_and_finish(spec, tmp.path());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCheckpoint);
    CHECK_THAT(e.what(), Catch::Contains(tmp.path()));
  }
}

TEST_CASE("checkpointer: each rank verifies its share of the files, and a corrupt one falls back for all", "[checkpointer]") {
  test::TempDir tmp;
  EngineSpec spec;
  spec.world = 3;
  spec.stage = 3;
  spec.steps = 4;
  const config::Recipe recipe = recipe_for(spec, false);
  EngineRun record;
  comm::run_on_threads(spec.world, [&](comm::Communicator& comm) {
    const auto model = test::make_tiny_model(spec.dtype);
    zero::Engine engine(*model, comm, test::engine_options(spec));
    model::TensorState shares({{"data.shard_weights", replicated_values()}});
    train::Checkpointer checkpointer(recipe, tmp.path(), comm, engine, {&shares}, "run1");
    for (int64_t step : {2, 4}) {
      test::train_steps(engine, *model, comm, spec, step - 2, 2, record);
      checkpointer.save(step, step * 8);
    }
  });
  const std::string newest = (std::filesystem::path(tmp.path()) / "step_00000004").string();
  // Format 3: the sharded tensors are placed by the shard table, not listed per rank.
  const nlohmann::json manifest = nlohmann::json::parse(read_file(newest + "/manifest.json"));
  CHECK(manifest["shards"]["ranks"] == 3);
  for (const auto& t : manifest["tensors"])
    CHECK((t["name"] == "engine.state" || t["name"] == "data.shard_weights" ? t["pieces"].is_array() : t["pieces"] == "shards"));
  // Reader::verify(part, parts) checks files part, part + parts, ... in name order.
  {
    std::fstream f(newest + "/rank_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x7f');
  }
  const ckpt::Reader reader(newest, /*verified=*/true);
  CHECK_NOTHROW(reader.verify(0, 3));
  CHECK_NOTHROW(reader.verify(2, 3));
  CHECK_THROWS_WITH(reader.verify(1, 3), Catch::Contains("rank_00001.bin") && Catch::Contains("checksum mismatch"));
  // Every rank of the resume takes the older checkpoint, though only rank 1 read the bad file.
  const Resumed resumed = resume_and_finish(spec, tmp.path());
  CHECK(resumed.step == 2);
  CHECK(resumed.cursor == 16);
  // Named, the damaged one is refused on every rank with the reason.
  comm::run_on_threads(spec.world, [&](comm::Communicator& comm) {
    const auto model = test::make_tiny_model(spec.dtype);
    zero::Engine engine(*model, comm, test::engine_options(spec));
    model::TensorState shares({{"data.shard_weights", at::zeros({5}, at::kFloat)}});
    train::Checkpointer checkpointer(recipe, tmp.path(), comm, engine, {&shares}, "run3");
    CHECK_THROWS_WITH(checkpointer.resume(newest), Catch::Contains("rank_00001.bin") && Catch::Contains("checksum mismatch"));
  });
}
