// Table-driven tests of the configuration layer: recipe YAML + ds_config JSON + --set, resolved
// with DeepSpeed's semantics (../shared/docs/reference/deepspeed-semantics.md).
#include "catch_torch.h"

#include <fstream>
#include <functional>
#include <set>

#include "dstrain/config/inert_keys.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/error.h"
#include "test_support.h"

using namespace dstrain;
using config::Recipe;

namespace {

struct Outcome {
  bool ok = false;
  Recipe recipe;
  std::string error;
  std::string warnings;  // all warnings, one per line
};

// Writes data.txt, recipe.yaml (the base keys + `yaml`) and, if given, ds.json, then loads.
Outcome load(const std::string& yaml, const std::string& ds = "", const std::vector<std::string>& overrides = {},
             const std::map<std::string, std::string>& extra_files = {}) {
  test::TempDir dir;
  std::ofstream(dir.path() + "/data.txt") << std::string(8192, 'x');
  for (const auto& [name, text] : extra_files) std::ofstream(dir.path() + "/" + name) << text;
  std::string text = "run_dir: run\ndata: {path: data.txt, seq_len: 32}\n" + yaml;
  if (!ds.empty()) {
    std::ofstream(dir.path() + "/ds.json") << ds;
    text += "\nds_config: ds.json\n";
  }
  std::ofstream(dir.path() + "/recipe.yaml") << text;
  Outcome out;
  try {
    out.recipe = config::load_recipe(dir.path() + "/recipe.yaml", overrides);
    out.ok = true;
    for (const auto& w : out.recipe.warnings) out.warnings += w + "\n";
  } catch (const Error& e) {
    out.error = e.what();
    CHECK(e.code() == ErrorCode::kConfig);
  }
  return out;
}

struct ValidCase {
  const char* name;
  std::string yaml;
  std::string ds;
  std::vector<std::string> overrides;
  std::function<void(const Outcome&)> check;
};

struct InvalidCase {
  const char* name;
  std::string yaml;
  std::string ds;
  std::vector<std::string> expected;  // substrings of the error
};

const std::string kTwoRanks = "launch: {nproc_per_node: 2}\ntrain: {steps: 10}\n";

// DeepSpeed's TestBatchConfig at world size 2, as ds_config values: (tb, micro, gas).
std::string batch_ds(int tb, int micro, int gas) {
  std::string s = "{";
  auto add = [&](const char* k, int v) {
    if (v) s += std::string(s.size() > 1 ? ", " : "") + "\"" + k + "\": " + std::to_string(v);
  };
  add("train_batch_size", tb);
  add("train_micro_batch_size_per_gpu", micro);
  add("gradient_accumulation_steps", gas);
  return s + "}";
}

void expect_batch(const Outcome& o, int64_t tb, int64_t micro, int64_t gas) {
  REQUIRE(o.ok);
  CHECK(o.recipe.train.global_batch_size == tb);
  CHECK(o.recipe.train.micro_batch_size == micro);
  CHECK(o.recipe.train.gradient_accumulation_steps == gas);
}

}  // namespace

TEST_CASE("valid configurations resolve as DeepSpeed would", "[config-cases]") {
  const std::vector<ValidCase> cases = {
      {"micro batch only, 1 rank", "train: {steps: 10, micro_batch_size: 4}\n", "", {}, [](const Outcome& o) { expect_batch(o, 4, 4, 1); }},
      {"ds batch (32,16,1)", kTwoRanks, batch_ds(32, 16, 1), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (32,16,-)", kTwoRanks, batch_ds(32, 16, 0), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (32,-,1)", kTwoRanks, batch_ds(32, 0, 1), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (-,16,1)", kTwoRanks, batch_ds(0, 16, 1), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (-,16,-)", kTwoRanks, batch_ds(0, 16, 0), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (32,-,-)", kTwoRanks, batch_ds(32, 0, 0), {}, [](const Outcome& o) { expect_batch(o, 32, 16, 1); }},
      {"ds batch (32,8,2)", kTwoRanks, batch_ds(32, 8, 2), {}, [](const Outcome& o) { expect_batch(o, 32, 8, 2); }},
      {"ds batch (32,8,-)", kTwoRanks, batch_ds(32, 8, 0), {}, [](const Outcome& o) { expect_batch(o, 32, 8, 2); }},
      {"ds batch (32,-,2)", kTwoRanks, batch_ds(32, 0, 2), {}, [](const Outcome& o) { expect_batch(o, 32, 8, 2); }},
      {"ds batch (-,8,2)", kTwoRanks, batch_ds(0, 8, 2), {}, [](const Outcome& o) { expect_batch(o, 32, 8, 2); }},
      {"train_batch_size alone at world size 1",
       "train: {steps: 10}\n",
       R"({"train_batch_size": 64})",
       {},
       [](const Outcome& o) { expect_batch(o, 64, 64, 1); }},
      {"hjson comments, trailing commas and 5e8 for an integer",
       "train: {steps: 10, micro_batch_size: 2}\n",
       "// comment\n{\n  # hash comment\n  \"zero_optimization\": {\"stage\": 1, /* inline */ \"allgather_bucket_size\": 5e8,},\n}\n",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.stage == 1);
         CHECK(o.recipe.zero.allgather_bucket_size == 500000000);
       }},
      {"bfloat16 is an alias of bf16",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"bfloat16": {"enabled": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.precision.dtype == config::Dtype::kBf16);
       }},
      {"bf16 wins over bfloat16, with a warning",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": false}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.precision.dtype == config::Dtype::kBf16);
         CHECK_THAT(o.warnings, Catch::Contains("bfloat16 is ignored"));
       }},
      {"zero_optimization: true is stage 1 with allgather_size",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": true, "allgather_size": 1000})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.stage == 1);
         CHECK(o.recipe.zero.allgather_bucket_size == 1000);
         CHECK_THAT(o.warnings, Catch::Contains("deprecated"));
       }},
      {"cpu_offload is offload_optimizer cpu",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.offload_optimizer == config::OffloadDevice::kCpu);
         CHECK_THAT(o.warnings, Catch::Contains("cpu_offload is deprecated use offload_optimizer"));
       }},
      {"stage3_gather_fp16_weights_on_model_save is the old name",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.stage3_gather_16bit_weights_on_model_save);
       }},
      {"keys without effect are accepted and said to be (issue 23)",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "sub_group_size": 1e8, "allgather_bucket_size": 2e8, "stage3_max_live_parameters": 5e8,
           "stage3_max_reuse_distance": 1e8, "contiguous_gradients": false, "reduce_scatter": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         for (const char* key : {"zero.sub_group_size = 100000000 (", "zero.allgather_bucket_size = 200000000 (",
                                 "zero.stage3_max_live_parameters = 500000000 (", "zero.stage3_max_reuse_distance = 100000000 (",
                                 "zero.contiguous_gradients = false ("})
           CHECK_THAT(o.warnings, Catch::Contains(key));
         CHECK_THAT(o.warnings, Catch::Contains("ds.json") && Catch::Contains("has no effect in dstrain: the optimizer steps"));
         CHECK_THAT(o.warnings, !Catch::Contains("zero.reduce_scatter"));  // DeepSpeed's default spelled out: no word
       }},
      {"offload_param at stage 3 keeps the parameter shard in host memory beside the offloaded optimizer (issue 23)",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": true},
           "offload_optimizer": {"device": "cpu"}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.offload_param == config::OffloadDevice::kCpu);
         CHECK_THAT(o.warnings, !Catch::Contains("offload_param"));
       }},
      {"offload's pin_memory is honoured: false keeps the host memory pageable (issue 23)",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": false}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK_FALSE(o.recipe.zero.pin_memory);
         CHECK(o.recipe.sources.at("zero.pin_memory").find("ds.json") != std::string::npos);
         CHECK_THAT(o.warnings, !Catch::Contains("pin_memory"));
       }},
      {"offload_param without offload_optimizer is refused, naming both keys",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})",
       {},
       [](const Outcome& o) {
         REQUIRE_FALSE(o.ok);
         CHECK_THAT(o.error, Catch::Contains("zero.offload_param = cpu (") && Catch::Contains("ds.json:1:") &&
                                 Catch::Contains("needs zero.offload_optimizer = cpu"));
       }},
      {"the activation_checkpointing block asks for full recompute; what it cannot do is named (issue 23)",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"activation_checkpointing": {"partition_activations": true, "contiguous_memory_optimization": true, "number_checkpoints": 4,
           "synchronize_checkpoint_boundary": false, "profile": true, "cpu_checkpointing": false}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.train.activation_checkpointing == config::Recompute::kFull);
         CHECK_THAT(o.warnings, Catch::Contains("activation_checkpointing.partition_activations = true has no effect in dstrain"));
         CHECK_THAT(o.warnings, Catch::Contains("activation_checkpointing.number_checkpoints = 4 has no effect"));
         CHECK_THAT(o.warnings, !Catch::Contains("synchronize_checkpoint_boundary"));  // DeepSpeed's default: no word
       }},
      {"the recipe's recompute mode stays beside the block",
       "train: {steps: 10, micro_batch_size: 2, activation_checkpointing: selective}\n",
       R"({"activation_checkpointing": {}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.train.activation_checkpointing == config::Recompute::kSelective);
       }},
      {"activation_checkpointing.cpu_checkpointing is refused by name",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"activation_checkpointing": {"cpu_checkpointing": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE_FALSE(o.ok);
         CHECK_THAT(o.error,
                    Catch::Contains("ds.json") && Catch::Contains("activation_checkpointing.cpu_checkpointing = true is not supported"));
       }},
      {"unprefixed stage-3 aliases",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1234, "max_live_parameters": 99}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.stage3_prefetch_bucket_size == 1234);
         CHECK(o.recipe.zero.stage3_max_live_parameters == 99);
       }},
      {"auto takes the recipe's values",
       "train: {steps: 10, micro_batch_size: 2, grad_clip: 0.5}\noptimizer: {lr: 0.01, beta1: 0.8, beta2: 0.9}\n",
       R"({"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.lr == 0.01);
         CHECK(o.recipe.optimizer.beta1 == 0.8);
         CHECK(o.recipe.train.grad_clip == 0.5);
         CHECK(o.recipe.train.micro_batch_size == 2);
         CHECK_THAT(o.recipe.sources.at("optimizer.lr"), Catch::Contains("filled into \"auto\""));
       }},
      {"auto bucket sizes derive from hidden_size as in the HF integration",
       "model: {hidden_size: 64}\ntrain: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
           "stage3_param_persistence_threshold": "auto"}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.reduce_bucket_size == 64 * 64);
         CHECK(o.recipe.zero.stage3_prefetch_bucket_size == 3686);  // int(0.9 * 4096)
         CHECK(o.recipe.zero.stage3_param_persistence_threshold == 640);
       }},
      {"Adam means AdamW unless adam_w_mode is false",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.01}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.type == config::OptimizerType::kAdam);
         CHECK(o.recipe.optimizer.weight_decay == 0.01);
       }},
      {"ADAM is case-insensitive and decoupled by default",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "ADAM"}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.type == config::OptimizerType::kAdamW);
       }},
      {"WarmupCosineLR maps with DeepSpeed's defaults",
       "train: {micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 500, "warmup_num_steps": 50}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.train.steps == 500);
         CHECK(o.recipe.schedule.type == config::ScheduleType::kDsWarmupCosine);
         CHECK(o.recipe.schedule.warmup_steps == 50);
         CHECK(o.recipe.schedule.warmup_type == config::WarmupType::kLog);  // DeepSpeed's default
         CHECK(o.recipe.schedule.min_lr_ratio == 0.0001);                   // cos_min_ratio default
       }},
      {"WarmupLR's absolute min and max LR",
       "train: {steps: 100, micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.004, "warmup_num_steps": 10}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.lr == 0.004);
         CHECK(o.recipe.schedule.warmup_min_ratio == Approx(0.25));
         CHECK(o.recipe.schedule.type == config::ScheduleType::kDsWarmup);
       }},
      {"OneCycle maps onto ds_one_cycle",
       "train: {steps: 100, micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.01, "cycle_first_step_size": 30,
           "decay_lr_rate": 0.5, "decay_step_size": 10, "cycle_momentum": false}}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.schedule.type == config::ScheduleType::kDsOneCycle);
         CHECK(o.recipe.schedule.cycle_min_lr == 0.0001);
         CHECK(o.recipe.schedule.cycle_max_lr == 0.01);
         CHECK(o.recipe.schedule.cycle_first_step_size == 30);
         CHECK(o.recipe.schedule.cycle_second_step_size == 0);  // DeepSpeed: None -> the first's
         CHECK(o.recipe.schedule.decay_lr_rate == 0.5);
         CHECK_FALSE(o.recipe.schedule.cycle_momentum);
         CHECK(o.recipe.schedule.warmup_steps == 0);
         CHECK_THAT(o.recipe.sources.at("schedule.cycle_max_lr"), Catch::Contains("ds.json:1:"));
       }},
      {"DeepSpeed's wandb monitor turns on the wandb sink, team as the entity",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"wandb": {"enabled": true, "team": "t", "group": "g", "project": "p"}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.logging.has_sink(config::Sink::kWandb));
         CHECK(o.recipe.logging.has_tracker());
         CHECK(o.recipe.logging.wandb_entity == "t");
         CHECK(o.recipe.logging.wandb_group == "g");
         CHECK(o.recipe.logging.wandb_project == "p");
         CHECK_THAT(o.recipe.sources.at("logging.wandb_entity"), Catch::Contains("ds.json:1:"));
       }},
      {"unknown top-level keys warn instead of vanishing",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"comms_config": {"x": 1}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK_THAT(o.warnings, Catch::Contains("comms_config: unknown top-level key"));
       }},
      {"a top-level key close to a known one is refused with the right name: it would leave that setting at its default",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"gradient_clip": 0.5, "train_micro_batch_size": 2})",
       {},
       [](const Outcome& o) {
         REQUIRE_FALSE(o.ok);
         CHECK_THAT(o.error, Catch::Contains("gradient_clip: unknown top-level key (did you mean 'gradient_clipping'?); DeepSpeed would "
                                             "ignore it and leave that setting at its default, so dstrain refuses it"));
         CHECK_THAT(o.error, Catch::Contains("train_micro_batch_size: unknown top-level key (did you mean "
                                             "'train_micro_batch_size_per_gpu'?)"));
       }},
      {"harmless unimplemented keys warn when set",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"memory_breakdown": true, "prescale_gradients": false, "wall_clock_breakdown": true})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK_THAT(o.warnings, Catch::Contains("memory_breakdown = true has no effect"));
         CHECK_THAT(o.warnings, !Catch::Contains("prescale_gradients"));  // at its default: silent
         CHECK(o.recipe.logging.wall_clock_breakdown);                    // implemented
         CHECK_THAT(o.recipe.sources.at("logging.wall_clock_breakdown"), Catch::Contains("ds.json:1:"));
       }},
      {"steps_per_print null means never",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"steps_per_print": null})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.logging.steps_per_print == 0);
       }},
      {"overlap_comm defaults to true at stage 3 only",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.overlap_comm);
       }},
      {"precedence: recipe < ds_config < --set, with sources",
       "train: {steps: 10, micro_batch_size: 2}\noptimizer: {lr: 0.1, eps: 1.0e-6}\n",
       R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.2, "eps": 1e-7}}})",
       {"optimizer.lr=0.3"},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.lr == 0.3);
         CHECK(o.recipe.sources.at("optimizer.lr") == "--set");
         CHECK(o.recipe.optimizer.eps == 1e-7);
         CHECK_THAT(o.recipe.sources.at("optimizer.eps"), Catch::Contains("ds.json:1:"));
         CHECK_THAT(o.warnings, Catch::Contains("overrides optimizer.eps"));
         CHECK(o.recipe.sources.at("optimizer.beta1") == "default");
       }},
      {"length in tokens",
       "train: {tokens: 1000, micro_batch_size: 2}\n",
       "",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.train.steps == 16);  // 64 tokens per step: ceil(1000 / 64)
       }},
      {"staged accumulation",
       "train: {steps: 20, micro_batch_size: 2, accumulation: [{until_step: 5, steps: 1}, {until_step: 10, steps: 2}, {steps: 4}]}\n",
       "",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         const Recipe& r = o.recipe;
         CHECK(config::accumulation_at(r, 4) == 1);
         CHECK(config::accumulation_at(r, 5) == 2);
         CHECK(config::accumulation_at(r, 19) == 4);
         CHECK(config::global_batch_at(r, 12) == 8);
         CHECK(config::samples_before(r, 0) == 0);
         CHECK(config::samples_before(r, 5) == 10);
         CHECK(config::samples_before(r, 7) == 18);
         CHECK(config::samples_before(r, 12) == 10 + 20 + 16);
       }},
      {"hf_config of a llama model",
       "model: {hf_config: llama.json}\ntrain: {steps: 10, micro_batch_size: 2}\n",
       "",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.model.hidden_size == 96);
         CHECK(o.recipe.model.num_layers == 3);
         CHECK(o.recipe.model.num_heads == 6);
         CHECK(o.recipe.model.max_seq_len == 256);
         CHECK(o.recipe.model.rope_theta == 500000);
       }},
      {"an HF Trainer ds_config: every \"auto\" the Trainer fills is filled from the recipe",
       "train: {steps: 40, micro_batch_size: 2, grad_clip: 0.5}\nmodel: {hidden_size: 64, num_heads: 4}\n"
       "optimizer: {lr: 2.0e-4, beta1: 0.9, beta2: 0.98, eps: 1.0e-6, weight_decay: 0.05}\nschedule: {warmup_steps: 4}\n"
       "precision: {dtype: bf16}\n",
       R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
           "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                                                              "total_num_steps": "auto"}},
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_param_persistence_threshold": "auto"},
           "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
           "train_micro_batch_size_per_gpu": "auto"})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.optimizer.lr == 2.0e-4);
         CHECK(o.recipe.optimizer.beta2 == 0.98);
         CHECK(o.recipe.optimizer.eps == 1.0e-6);
         CHECK(o.recipe.schedule.type == config::ScheduleType::kDsWarmupDecay);
         CHECK(o.recipe.schedule.warmup_steps == 4);
         CHECK(o.recipe.schedule.warmup_min_ratio == 0);
         CHECK_THAT(o.recipe.sources.at("schedule.warmup_min_ratio"), Catch::Contains("as the HF Trainer fills it"));
         CHECK(o.recipe.train.steps == 40);
         CHECK(o.recipe.train.grad_clip == 0.5);
         CHECK(o.recipe.train.micro_batch_size == 2);
         CHECK(o.recipe.zero.reduce_bucket_size == 64 * 64);
         CHECK(o.recipe.zero.stage3_prefetch_bucket_size == static_cast<int64_t>(0.9 * 64 * 64));
         CHECK(o.recipe.zero.stage3_param_persistence_threshold == 640);
         CHECK(o.recipe.precision.dtype == config::Dtype::kBf16);
       }},
      {"inline deepspeed mapping in the recipe",
       "train: {steps: 10}\ndeepspeed: {train_micro_batch_size_per_gpu: 3, zero_optimization: {stage: 2}}\n",
       "",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.train.micro_batch_size == 3);
         CHECK(o.recipe.zero.stage == 2);
         CHECK_THAT(o.recipe.sources.at("zero.stage"), Catch::Contains("recipe.yaml:4:"));
       }},
      {"fp16 loss scaling section",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"fp16": {"enabled": true, "loss_scale_window": 500, "hysteresis": 1, "min_loss_scale": 1.0, "initial_scale_power": 12}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.precision.dtype == config::Dtype::kFp16);
         CHECK(o.recipe.precision.loss_scale_window == 500);
         CHECK(o.recipe.precision.hysteresis == 1);
         CHECK(o.recipe.precision.initial_scale_power == 12);
       }},
      {"monitors become sinks",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"tensorboard": {"enabled": true, "job_name": "x"}, "csv_monitor": {"enabled": false}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.logging.sinks ==
               std::vector<config::Sink>{config::Sink::kConsole, config::Sink::kJsonl, config::Sink::kTensorboard});
         CHECK(o.recipe.logging.tensorboard_dir.empty());  // no output_path: the run directory's
       }},
      {"monitor output paths are DeepSpeed's output_path/job_name",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"tensorboard": {"enabled": true, "output_path": "/tmp/tb", "job_name": "exp1"}, "csv_monitor": {"enabled": true, "output_path": "/tmp/csv"}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.logging.tensorboard_dir == "/tmp/tb/exp1");
         CHECK(o.recipe.logging.csv_dir == "/tmp/csv/DeepSpeedJobName");
         CHECK(o.recipe.logging.sinks ==
               std::vector<config::Sink>{config::Sink::kConsole, config::Sink::kJsonl, config::Sink::kTensorboard, config::Sink::kCsv});
       }},
      {"pydantic's lax coercions",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": "3", "contiguous_gradients": "no", "reduce_bucket_size": 2.0}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.zero.stage == 3);
         CHECK_FALSE(o.recipe.zero.contiguous_gradients);
         CHECK(o.recipe.zero.reduce_bucket_size == 2);
       }},
      {"checkpoint.tag_validation and disabled sections are accepted",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"checkpoint": {"tag_validation": "Fail"}, "pipeline": {}, "amp": {"enabled": false}, "elasticity": {"enabled": false}})",
       {},
       [](const Outcome& o) { REQUIRE(o.ok); }},
      {"DeepSpeed's pipeline block: stages is the pipeline's size, the rest warns",
       "launch: {nproc_per_node: 2}\ntrain: {steps: 10, micro_batch_size: 2, gradient_accumulation_steps: 2}\n",
       R"({"pipeline": {"stages": 2, "partition": "parameters", "activation_checkpoint_interval": 1, "pipe_partitioned": true}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.parallel.pipeline_parallel_size == 2);
         CHECK(o.recipe.sources.at("parallel.pipeline_parallel_size").find("ds.json") != std::string::npos);
         CHECK(o.recipe.data_parallel_size() == 1);
         CHECK(o.recipe.train.global_batch_size == 4);  // micro 2 x accumulation 2 x 1 data-parallel rank
         CHECK(o.warnings.find("pipeline.partition = \"parameters\" has no effect") != std::string::npos);
         CHECK(o.warnings.find("use train.activation_checkpointing") != std::string::npos);
       }},
      {"DeepSpeed's sequence_parallel_size: Ulysses over 2 ranks, the batch math over world / 2",
       "launch: {nproc_per_node: 4}\ntrain: {steps: 10, micro_batch_size: 2, gradient_accumulation_steps: 2}\n",
       R"({"sequence_parallel_size": 2})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.parallel.sequence_parallel_size == 2);
         CHECK(o.recipe.sources.at("parallel.sequence_parallel_size").find("ds.json") != std::string::npos);
         CHECK(o.recipe.data_parallel_size() == 2);
         CHECK(o.recipe.train.global_batch_size == 8);  // micro 2 x accumulation 2 x (4 ranks / 2)
         CHECK(o.recipe.layout().data() == 4);          // ZeRO spans all four
       }},
      {"DeepSpeed's pipeline block: stages auto is no pipeline",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"pipeline": {"stages": "auto"}})",
       {},
       [](const Outcome& o) {
         REQUIRE(o.ok);
         CHECK(o.recipe.parallel.pipeline_parallel_size == 1);
       }},
  };
  const std::map<std::string, std::string> files = {
      {"llama.json",
       R"({"model_type": "llama", "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 6,
                         "intermediate_size": 256, "vocab_size": 300, "max_position_embeddings": 256, "rope_theta": 500000.0,
                         "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "rope_scaling": null})"}};
  CHECK(cases.size() >= 30);
  for (const auto& c : cases) {
    INFO("case: " << c.name);
    const Outcome o = load(c.yaml, c.ds, c.overrides, files);
    INFO("error: " << o.error);
    c.check(o);
  }
}

TEST_CASE("invalid configurations fail with the key, the place and the fix", "[config-cases]") {
  const std::vector<InvalidCase> cases = {
      {"duplicate key",
       "train: {steps: 10}\n",
       "{\n  \"train_batch_size\": 8,\n  \"train_batch_size\": 16\n}",
       {"ds.json:3:3: duplicate key \"train_batch_size\""}},
      {"gas only", kTwoRanks, batch_ds(0, 0, 2), {"Either train.global_batch_size (train_batch_size) or train.micro_batch_size"}},
      {"(33,17,2)", kTwoRanks, batch_ds(33, 17, 2), {"train_batch_size 33 != micro 17 x accumulation 2 x 2 ranks = 68"}},
      {"(33,17,-)", kTwoRanks, batch_ds(33, 17, 0), {"gradient accumulation steps = train_batch_size 33 // micro 17 // 2 ranks = 0"}},
      {"(33,-,2)", kTwoRanks, batch_ds(33, 0, 2), {"train_batch_size 33 != micro 8 x accumulation 2 x 2 ranks = 32", "use 32 or 48"}},
      {"(32,18,1)", kTwoRanks, batch_ds(32, 18, 1), {"32 != micro 18 x accumulation 1 x 2 ranks = 36"}},
      {"(32,18,-)", kTwoRanks, batch_ds(32, 18, 0), {"= 0: the global batch 32 is smaller than micro 18 x 2 ranks"}},
      {"fractional integer",
       "train: {steps: 10}\n",
       R"({"train_micro_batch_size_per_gpu": 2.5})",
       {"ds.json:1:2: train_micro_batch_size_per_gpu (train.micro_batch_size: expected a whole number, found '2.5')"}},
      {"auto without a recipe value",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})",
       {"optimizer.params.lr is \"auto\", but the recipe does not set optimizer.lr"}},
      {"negative z-loss weight",
       "train: {steps: 10, micro_batch_size: 2, z_loss_weight: -0.001}\n",
       "",
       {"train.z_loss_weight: -0.001 is out of range [0, 1e+06]"}},
      {"z-loss weight not a number",
       "train: {steps: 10, micro_batch_size: 2, z_loss_weight: .nan}\n",
       "",
       {"train.z_loss_weight", "expected a number"}},
      {"delayed update without offload",
       "train: {steps: 10, micro_batch_size: 2}\nzero: {stage: 2, delayed_update: true}\n",
       "",
       {"zero.delayed_update (", "recipe.yaml:4:", "needs zero.offload_optimizer = cpu"}},
      {"expert parallelism on a dense model",
       "launch: {nproc_per_node: 2}\ntrain: {steps: 10, micro_batch_size: 2}\nmoe: {expert_parallel_size: 2}\n",
       "",
       {"moe.expert_parallel_size 2 needs an MoE model (model.family mla_moe); this model is dense"}},
      {"expert parallelism that splits no expert evenly",
       "launch: {nproc_per_node: 4}\ntrain: {steps: 10, micro_batch_size: 2}\nmodel: {family: mla_moe, n_routed_experts: 6, "
       "num_experts_per_tok: 2}\n"
       "moe: {expert_parallel_size: 4}\n",
       "",
       {"moe.expert_parallel_size 4 does not divide model.n_routed_experts 6"}},
      {"expert parallelism beyond the world",
       "launch: {nproc_per_node: 2}\ntrain: {steps: 10, micro_batch_size: 2}\nmodel: {family: mla_moe, n_routed_experts: 4, "
       "num_experts_per_tok: 2}\n"
       "moe: {expert_parallel_size: 4}\n",
       "",
       {"moe.expert_parallel_size 4 does not divide the world size 2 (1 node(s) x 2 per node)"}},
      {"fp16 and bf16 together",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
       {"bf16 and fp16 cannot both be enabled"}},
      {"unknown key in a section",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 2, "overlap_com": true}})",
       {"zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)"}},
      {"unsupported optimizer",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "Lamb"}})",
       {"optimizer.type 'Lamb' is not supported", "Adam and AdamW"}},
      {"max_grad_norm in optimizer params",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
       {"use the top-level \"gradient_clipping\""}},
      {"nvme offload",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
       {"offload_optimizer.device \"nvme\" is not supported", "use \"cpu\""}},
      {"pipeline stages beyond the world",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"pipeline": {"stages": 2}})",
       {"parallel.pipeline_parallel_size 2 does not divide the world size 1"}},
      {"sequence parallelism: the sequence, the heads and the ranks",
       "launch: {nproc_per_node: 3}\nmodel: {num_heads: 4}\ntrain: {steps: 10, micro_batch_size: 2}\n",
       R"({"sequence_parallel_size": 3})",
       {"data.seq_len 32 is not divisible by parallel.sequence_parallel_size 3",
        "parallel.sequence_parallel_size 3 does not divide model.num_heads 4"}},
      {"sequence parallelism beyond the ranks",
       "launch: {nproc_per_node: 2}\ntrain: {steps: 10, micro_batch_size: 2}\n",
       R"({"sequence_parallel_size": 4})",
       {"parallel.sequence_parallel_size 4 does not divide the 2 data-parallel ranks"}},
      {"pipeline block: an unknown key",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"pipeline": {"stage": 2}})",
       {"pipeline.stage: unknown key (did you mean 'stages'?)"}},
      {"deprecated with replacement",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
       {"Cannot provide deprecated parameter 'cpu_offload' and replacing parameter 'offload_optimizer' together"}},
      {"alias given twice",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})",
       {"'prefetch_bucket_size' and its alias"}},
      {"stage 4",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 4}})",
       {"zero_optimization.stage: 4 is not 0, 1, 2 or 3"}},
      {"LRRangeTest",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "LRRangeTest", "params": {}}})",
       {"scheduler.type 'LRRangeTest' is not supported", "OneCycle"}},
      {"OneCycle stairs",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "OneCycle", "params": {"cycle_first_stair_count": 2}}})",
       {"cycle_first_stair_count", "continuous"}},
      {"JSON syntax",
       "train: {steps: 10, micro_batch_size: 2}\n",
       "{\n  \"fp16\": {\"enabled\": true\n  \"bf16\": {}\n}",
       {"ds.json:3:3: expected ',' or '}'"}},
      {"fractional min_loss_scale",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"fp16": {"enabled": true, "min_loss_scale": 0.5}})",
       {"min_loss_scale", "expected a whole number, found '0.5'"}},
      {"sum all-reduce",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"gradient_allreduce_op": "sum"})",
       {"gradient_allreduce_op = \"sum\" is not supported by dstrain, and it would change the training math"}},
      {"quantized gradients",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})",
       {"zero_quantized_gradients = true is not supported"}},
      {"steps and tokens",
       "train: {steps: 10, tokens: 1000, micro_batch_size: 2}\n",
       "",
       {"train.steps (", "and train.tokens (", "are both set"}},
      {"no length",
       "train: {micro_batch_size: 2}\n",
       "",
       {"the training length is missing: set train.steps, train.tokens or train.epochs"}},
      {"stages with gradient_accumulation_steps",
       "train: {steps: 10, micro_batch_size: 2, gradient_accumulation_steps: 2, accumulation: [{steps: 2}]}\n",
       "",
       {"conflicts with train.accumulation"}},
      {"stage order",
       "train: {steps: 10, micro_batch_size: 2, accumulation: [{until_step: 5, steps: 1}, {until_step: 3, steps: 2}, {steps: 4}]}\n",
       "",
       {"until_step 3 must be greater than the previous stage's 5"}},
      {"a batch size written as a string",
       "train: {steps: 10}\n",
       R"({"train_micro_batch_size_per_gpu": "4"})",
       {"ds.json:1:", "train_micro_batch_size_per_gpu: expected a number, found the string \"4\"", "write 4 without quotes"}},
      {"an optimizer parameter written as a string",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"optimizer": {"type": "AdamW", "params": {"lr": "1e-3"}}})",
       {"optimizer.params.lr: expected a number, found the string \"1e-3\""}},
      {"warmup_min_lr written as a string",
       "train: {steps: 10, micro_batch_size: 2}\n",
       R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "0"}}})",
       {"scheduler.params.warmup_min_lr: expected a number, found the string \"0\""}},
      {"MoE hf_config",
       "model: {hf_config: v3.json}\ntrain: {steps: 10, micro_batch_size: 2}\n",
       "",
       {"model_type 'deepseek' is not supported"}},
  };
  const std::map<std::string, std::string> files = {{"v3.json", R"({"model_type": "deepseek", "hidden_size": 2048})"}};
  CHECK(cases.size() >= 20);
  for (const auto& c : cases) {
    INFO("case: " << c.name);
    test::TempDir dir;
    const Outcome o = load(c.yaml, c.ds, {}, c.name == std::string("MoE hf_config") ? files : std::map<std::string, std::string>{});
    REQUIRE_FALSE(o.ok);
    for (const auto& e : c.expected) CHECK_THAT(o.error, Catch::Contains(e));
  }
}

TEST_CASE("every zero.* key either changes what the engine does or is listed as having no effect", "[config-cases]") {
  // The keys zero::options_from reads; any other zero key must say why it does nothing.
  const std::set<std::string> acting{"zero.stage",
                                     "zero.reduce_bucket_size",
                                     "zero.overlap_comm",
                                     "zero.offload_optimizer",
                                     "zero.offload_param",
                                     "zero.pin_memory",
                                     "zero.delayed_update",
                                     "zero.delayed_update_after",
                                     "zero.stage3_prefetch_bucket_size",
                                     "zero.stage3_param_persistence_threshold"};
  std::set<std::string> inert;
  for (const auto& k : config::inert_keys()) {
    CHECK_FALSE(k.why.empty());
    CHECK(config::find_field(k.key) != nullptr);
    inert.insert(k.key);
  }
  for (const auto& f : config::recipe_schema()) {
    if (f.path.rfind("zero.", 0) != 0) continue;
    INFO(f.path);
    CHECK(acting.count(f.path) + inert.count(f.path) == 1);
  }
}
