#include "catch_torch.h"

#include <fstream>

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "test_support.h"

using namespace dstrain;

namespace {

// Writes a recipe next to a small data file; returns the recipe path.
std::string write_recipe(const test::TempDir& dir, const std::string& yaml) {
  std::ofstream(dir.path() + "/data.txt") << std::string(4096, 'a');
  const std::string path = dir.path() + "/recipe.yaml";
  std::ofstream(path) << yaml;
  return path;
}

const char* kMinimal = "run_dir: RUN\ndata:\n  path: data.txt\n  seq_len: 32\nmodel:\n  max_seq_len: 32\n";
const std::vector<std::string> kBatch = {"train.micro_batch_size=8", "train.global_batch_size=16"};
std::vector<std::string> with_batch(std::vector<std::string> extra) {
  extra.insert(extra.begin(), kBatch.begin(), kBatch.end());
  return extra;
}

std::string config_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    config::load_recipe(path, overrides);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kConfig);
    return e.what();
  }
  FAIL("no error was raised");
  return "";
}

}  // namespace

TEST_CASE("the bundled demo recipe is valid", "[config]") {
  const auto r = config::load_recipe(test::source_dir() + "/recipes/demo.yaml");
  CHECK(r.launch.nproc_per_node == 2);
  CHECK(r.data.path == test::source_dir() + "/recipes/data/demo_corpus.txt");
  CHECK(config::accumulation_at(r, 0) == 1);
  CHECK(config::global_batch_at(r, 0) == 16);
  const auto single = config::load_recipe(test::source_dir() + "/recipes/demo.yaml", {"launch.nproc_per_node=1"});
  CHECK(single.train.gradient_accumulation_steps == 2);  // same global batch on one rank
  CHECK(single.train.global_batch_size == 16);
}

TEST_CASE("defaults, values and --set overrides", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, std::string(kMinimal) + "train:\n  steps: 5e3\n  micro_batch_size: 4\noptimizer:\n  lr: 1.5e-4\n");
  auto r = config::load_recipe(path);
  CHECK(r.train.steps == 5000);
  CHECK(r.optimizer.lr == Approx(1.5e-4));
  CHECK(r.optimizer.beta1 == 0.9);  // default
  CHECK(r.sources.at("optimizer.beta1") == "default");
  CHECK(r.sources.at("optimizer.lr") == path + ":11:7");
  CHECK(r.data.path == dir.path() + "/data.txt");  // relative to the recipe
  r = config::load_recipe(path, {"train.steps=7", "schedule.warmup_steps=2", "seed=99", "model.family=dense"});
  CHECK(r.train.steps == 7);
  CHECK(r.seed == 99);
}

TEST_CASE("every problem is reported at once with file:line:column", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, std::string(kMinimal) +
                                          "train:\n"
                                          "  stepz: 10\n"                       // line 8: unknown key
                                          "  lr: fast\n"                        // line 9: right key, wrong section
                                          "  micro_batch_size: 2.5\n"           // line 10: not whole
                                          "optimiser: {}\n"                     // line 11: unknown section
                                          "schedule: {min_lr_ratio: high}\n");  // line 12: not a number
  const std::string message = config_error(path);
  CHECK_THAT(message, Catch::Contains("5 problems"));
  CHECK_THAT(message, Catch::Contains("recipe.yaml:8:3: train.stepz: unknown key (did you mean 'steps'?)"));
  CHECK_THAT(message, Catch::Contains("recipe.yaml:9:3: train.lr: unknown key (it belongs in the optimizer section: optimizer.lr)"));
  CHECK_THAT(message, Catch::Contains("recipe.yaml:10:21: train.micro_batch_size: expected a whole number, found '2.5'"));
  CHECK_THAT(message, Catch::Contains("recipe.yaml:11:1: optimiser: unknown key (did you mean 'optimizer'?)"));
  CHECK_THAT(message, Catch::Contains("recipe.yaml:12:26: schedule.min_lr_ratio: expected a number, found string 'high'"));
}

TEST_CASE("range, choice and cross-field checks", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, std::string(kMinimal) + "train: {steps: 10}\n");
  CHECK_THAT(config_error(path, with_batch({"launch.nproc_per_node=0"})), Catch::Contains("launch.nproc_per_node: 0 is out of range"));
  CHECK_THAT(config_error(path, with_batch({"model.family=moe"})), Catch::Contains("model.family: 'moe' is not supported; allowed: dense"));
  CHECK_THAT(config_error(path, with_batch({"model.num_heads=3"})),
             Catch::Contains("model.num_heads: 3 does not divide model.hidden_size 64"));
  CHECK_THAT(config_error(path, with_batch({"data.seq_len=64"})),
             Catch::Contains("data.seq_len 64 (--set) exceeds model.max_seq_len 32 (" + path +
                             ":6:16): set data.seq_len: 32 or less "
                             "(--set data.seq_len=32), or model.max_seq_len: 64"));
  try {  // a missing dataset alone is a data error (exit 3); with other problems it is listed among them
    config::load_recipe(path, with_batch({"data.path=nope.bin"}));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kData);
    CHECK_THAT(e.what(), Catch::Contains("data.path:") && Catch::Contains("nope.bin"));
  }
  CHECK_THAT(config_error(path, with_batch({"data.path=nope.bin", "data.seq_len=64"})),
             Catch::Contains("nope.bin") && Catch::Contains("exceeds"));
  CHECK_THAT(config_error(path, {"train.global_batch_size=12", "train.micro_batch_size=8"}),
             Catch::Contains("train_batch_size 12 != micro 8 x accumulation 1 x 1 rank = 8"));
  CHECK_THAT(
      config_error(path, with_batch({"schedule.warmup_steps=50"})),
      Catch::Contains("schedule.warmup_steps 50 (--set) is longer than the run's 10 steps (" + path +
                      ":7:16): shorten the warmup, e.g. --set schedule.warmup_steps=1, or train longer, e.g. --set train.steps=500"));
  CHECK_THAT(config_error(path, with_batch({"logging.profile_step=11"})),
             Catch::Contains("logging.profile_step 11 (--set) is past the run's last step 10"));
  CHECK_THAT(config_error(path, with_batch({"zero.offload_optimizer=cpu"})), Catch::Contains("needs ZeRO stage 1, 2 or 3"));
  CHECK_THAT(config_error(path, {"train.stepz=3"}), Catch::Contains("--set train.stepz: unknown key (did you mean 'train.steps'?)"));
  CHECK_THAT(config_error(path, {"novalue"}), Catch::Contains("expected key.path=value"));
}

TEST_CASE("malformed YAML and missing files name the file", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, "model: [unclosed\n");
  CHECK_THAT(config_error(path), Catch::Contains("recipe.yaml:") && Catch::Contains("not valid YAML"));
  CHECK_THAT(config_error(dir.path() + "/absent.yaml"), Catch::Contains("absent.yaml' does not exist"));
}

TEST_CASE("accumulation steps follow the world size or fail with the numbers", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, std::string(kMinimal) + "train: {steps: 10, micro_batch_size: 4, global_batch_size: 32}\n");
  for (auto [ranks, accum] : std::vector<std::pair<int, int>>{{1, 8}, {4, 2}, {8, 1}}) {
    const auto r = config::load_recipe(path, {"launch.nproc_per_node=" + std::to_string(ranks)});
    CHECK(r.train.gradient_accumulation_steps == accum);
  }
  CHECK_THAT(config_error(path, {"launch.nproc_per_node=3"}),
             Catch::Contains("The global batch must be a multiple of micro x ranks = 12: use 24 or 36"));
}

TEST_CASE("the resolved config round-trips and refuses tampering", "[config]") {
  test::TempDir dir;
  const auto recipe =
      config::load_recipe(write_recipe(dir, std::string(kMinimal) + "train: {steps: 10, micro_batch_size: 2}\n"), {"optimizer.lr=0.00123"});
  const std::string resolved = dir.path() + "/config.resolved.json";
  config::write_resolved_config(recipe, resolved);
  const auto back = config::read_resolved_config(resolved);
  CHECK(config::to_canonical_json(back) == config::to_canonical_json(recipe));
  CHECK(back.optimizer.lr == 0.00123);
  CHECK(back.sources.at("optimizer.lr") == "--set");

  std::string text = read_file(resolved);
  text.replace(text.find("0.00123"), 7, "0.00124");
  write_file_atomic(resolved, text);
  CHECK_THROWS_WITH(config::read_resolved_config(resolved), Catch::Contains("does not match its content"));
}

TEST_CASE("a resolved config written before a key existed still reads, the key at its default", "[config]") {
  // Written by dstrain 28d36fe, before model.rope_scaling and its parameters: resuming such a run
  // must keep working after an upgrade.
  const std::string old = test::source_dir() + "/test/unit/config/fixtures/config.resolved.before-rope-scaling.json";
  const auto recipe = config::read_resolved_config(old);
  CHECK(recipe.model.rope_scaling == config::RopeScaling::kNone);
  CHECK(recipe.model.hidden_size == 128);
  CHECK(recipe.sources.at("model.rope_scaling").find("written by an earlier dstrain") != std::string::npos);
  CHECK(recipe.moe.expert_parallel_size == 1);  // a whole section added since (issue 22)
  CHECK(recipe.sources.at("moe.expert_parallel_size").find("written by an earlier dstrain") != std::string::npos);

  test::TempDir dir;  // tampering is still refused
  std::string text = read_file(old);
  text.replace(text.find("\"hidden_size\": 128"), 18, "\"hidden_size\": 192");
  write_file_atomic(dir.path() + "/old.json", text);
  CHECK_THROWS_WITH(config::read_resolved_config(dir.path() + "/old.json"), Catch::Contains("does not match its content"));
}

TEST_CASE("recipes/README.md documents every key of the schema", "[config]") {
  const std::string doc = read_file(test::source_dir() + "/recipes/README.md");
  const std::string begin = "<!-- keys:begin -->\n", end = "<!-- keys:end -->";
  const auto a = doc.find(begin), b = doc.find(end);
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  INFO("regenerate it with scripts/gen-recipe-docs.sh");
  CHECK(doc.substr(a + begin.size(), b - a - begin.size()) == cost::schema_markdown());
  for (const auto& field : config::recipe_schema()) CHECK_THAT(doc, Catch::Contains("`" + field.path + "`"));
}

TEST_CASE("every bundled recipe resolves", "[config]") {
  for (const char* name : {"demo.yaml", "deepseek-llm-7b.yaml", "deepseek-coder-1.3b.yaml", "deepseek-v2-lite.yaml", "tiny-mla-moe.yaml"}) {
    INFO(name);
    CHECK_NOTHROW(config::load_recipe(test::source_dir() + "/recipes/" + name));
  }
  // The V2-Lite preset takes its sizes from the bundled Hugging Face config.json.
  const auto lite = config::load_recipe(test::source_dir() + "/recipes/deepseek-v2-lite.yaml");
  CHECK(lite.model.family == config::ModelFamily::kMlaMoe);
  CHECK(lite.model.q_lora_rank == 0);  // null in config.json: a direct q_proj
  CHECK(lite.model.n_routed_experts == 64);
  CHECK(lite.model.init_std == 0.006);  // set in the recipe: wins over config.json's initializer_range
  CHECK(cost::parameter_counts(lite.model).total == 15706484224);
  CHECK_THAT(lite.sources.at("model.kv_lora_rank"), Catch::Contains("deepseek-v2-lite/config.json:"));
}

TEST_CASE("a batch-size ramp becomes accumulation stages, by steps or by tokens", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(
      dir, std::string(kMinimal) + "train: {steps: 100, micro_batch_size: 2, global_batch_size: 16}\nlaunch: {nproc_per_node: 2}\n");
  // 4 -> 16 samples: accumulation 1, 2, 3 during the ramp, then 4.
  const auto by_steps = config::load_recipe(path, {"train.batch_ramp_start=4", "train.batch_ramp_steps=30"});
  CHECK(config::global_batch_at(by_steps, 0) == 4);
  CHECK(config::global_batch_at(by_steps, 9) == 4);
  CHECK(config::global_batch_at(by_steps, 10) == 8);
  CHECK(config::global_batch_at(by_steps, 20) == 12);
  CHECK(config::global_batch_at(by_steps, 29) == 12);
  CHECK(config::global_batch_at(by_steps, 30) == 16);
  CHECK(config::global_batch_at(by_steps, 99) == 16);
  CHECK(config::samples_before(by_steps, 30) == 10 * 4 + 10 * 8 + 10 * 12);
  CHECK_THAT(by_steps.sources.at("train.accumulation"), Catch::Contains("batch ramp 4 -> 16 over 30 steps"));
  // By tokens: 3 levels share 3840 tokens = 120 samples of 32: 40 each -> 10, 5 and 4 steps.
  const auto by_tokens = config::load_recipe(path, {"train.batch_ramp_start=4", "train.batch_ramp_tokens=3840"});
  CHECK(config::global_batch_at(by_tokens, 9) == 4);
  CHECK(config::global_batch_at(by_tokens, 10) == 8);
  CHECK(config::global_batch_at(by_tokens, 14) == 8);
  CHECK(config::global_batch_at(by_tokens, 15) == 12);
  CHECK(config::global_batch_at(by_tokens, 18) == 12);
  CHECK(config::global_batch_at(by_tokens, 19) == 16);
  CHECK_THAT(config_error(path, {"train.batch_ramp_start=6", "train.batch_ramp_steps=30"}),
             Catch::Contains("must be a multiple of micro 2 x 2 ranks = 4"));
  CHECK_THAT(config_error(path, {"train.batch_ramp_start=4"}),
             Catch::Contains("needs exactly one of train.batch_ramp_steps and train.batch_ramp_tokens"));
  CHECK_THAT(config_error(path, {"train.batch_ramp_start=16", "train.batch_ramp_steps=3"}), Catch::Contains("below the global batch 16"));
}

TEST_CASE("accumulation stages may end at a token count", "[config]") {
  test::TempDir dir;
  const auto path = write_recipe(dir, std::string(kMinimal) + "train: {steps: 100, micro_batch_size: 2}\nlaunch: {nproc_per_node: 2}\n");
  // Stage 0: 4 samples x 32 tokens = 128 tokens per step; 1000 tokens -> 8 steps (1024 tokens).
  // Stage 1: 256 tokens per step from 1024 to 3000 -> 8 more steps (to 3072 tokens), until step 16.
  const auto r =
      config::load_recipe(path, {"train.accumulation=[{until_tokens: 1000, steps: 1}, {until_tokens: 3000, steps: 2}, {steps: 4}]"});
  REQUIRE(r.train.accumulation.size() == 3);
  CHECK(r.train.accumulation[0].until_step == 8);
  CHECK(r.train.accumulation[1].until_step == 16);
  CHECK(config::global_batch_at(r, 7) == 4);
  CHECK(config::global_batch_at(r, 8) == 8);
  CHECK(config::global_batch_at(r, 16) == 16);
  CHECK_THAT(r.sources.at("train.accumulation"), Catch::Contains("until_tokens 3000 -> until_step 16"));
  // Mixed with until_step, and refused when a stage would not grow.
  const auto mixed =
      config::load_recipe(path, {"train.accumulation=[{until_step: 5, steps: 1}, {until_tokens: 2000, steps: 2}, {steps: 4}]"});
  CHECK(mixed.train.accumulation[1].until_step == 5 + 6);  // 640 tokens by step 5; (2000-640)/256 -> 6 steps
  CHECK_THAT(config_error(path, {"train.accumulation=[{until_step: 20, steps: 1}, {until_tokens: 1000, steps: 2}, {steps: 4}]"}),
             Catch::Contains("must grow"));
  CHECK_THAT(config_error(path, {"train.accumulation=[{until_step: 2, until_tokens: 5, steps: 1}, {steps: 4}]"}),
             Catch::Contains("not both"));
}

TEST_CASE("enum settings: the schema's choices are the enums' names, and the resolved config keeps them as names", "[config]") {
  for (const auto& f : config::recipe_schema()) {
    config::Recipe r;
    const auto target = f.target(r);
    if (!std::holds_alternative<config::EnumTarget>(target) && !std::holds_alternative<config::EnumListTarget>(target)) continue;
    INFO(f.path);
    CHECK(f.choices.size() >= 2);
  }
  test::TempDir dir;
  const std::string path = write_recipe(dir, std::string(kMinimal) +
                                                 "train: {steps: 4, micro_batch_size: 2, on_bad_step: rollback}\n"
                                                 "precision: {dtype: bf16}\nschedule: {type: wsd}\n"
                                                 "logging: {sinks: [jsonl, csv]}\nzero: {stage: 1, offload_optimizer: cpu}\n");
  const config::Recipe r = config::load_recipe(path);
  CHECK(r.precision.dtype == config::Dtype::kBf16);
  CHECK(r.schedule.type == config::ScheduleType::kWsd);
  CHECK(r.train.on_bad_step == config::BadStepAction::kRollback);
  CHECK(r.zero.offload_optimizer == config::OffloadDevice::kCpu);
  CHECK(r.logging.sinks == std::vector<config::Sink>{config::Sink::kJsonl, config::Sink::kCsv});
  const std::string json = config::to_canonical_json(r);
  CHECK_THAT(json, Catch::Contains("\"dtype\":\"bf16\"") && Catch::Contains("\"sinks\":[\"jsonl\",\"csv\"]") &&
                       Catch::Contains("\"on_bad_step\":\"rollback\""));
  config::write_resolved_config(r, dir.path() + "/resolved.json");
  const config::Recipe back = config::read_resolved_config(dir.path() + "/resolved.json");
  CHECK(config::config_hash(back) == config::config_hash(r));
  CHECK(back.logging.sinks == r.logging.sinks);
  CHECK(back.schedule.type == config::ScheduleType::kWsd);
}
