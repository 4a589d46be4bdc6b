// The dead ends a new user hit in their first hour, each as the config layer must now answer it:
// the dataset's own description, the weights' own config.json, Hugging Face's stock ds_config,
// and errors whose hint is the command that fixes them.
#include "catch_torch.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/hf_overrides.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/prepare.h"
#include "test_support.h"

using namespace dstrain;

namespace {

// Error of a load that must fail, with its code.
Error load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    config::load_recipe(path, overrides);
  } catch (const Error& e) {
    return e;
  }
  FAIL("no error was raised");
  return Error(ErrorCode::kInternal, "", "");
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// `dstrain prepare-data` of some text: DIR/corpus.{bin,idx,json}, byte-level (vocab 257, eos 256).
std::string prepare_corpus(const test::TempDir& dir) {
  write(dir.path() + "/text.txt", std::string(20000, 'x') + "\n");
  data::PrepareOptions o;
  o.inputs = {dir.path() + "/text.txt"};
  o.output_prefix = dir.path() + "/corpus";
  o.workers = 1;
  data::prepare_dataset(o);
  return o.output_prefix;
}

}  // namespace

TEST_CASE("a dataset from prepare-data gives the recipe its format, vocabulary and end-of-document token", "[config]") {
  test::TempDir dir;
  prepare_corpus(dir);
  const std::string recipe = write(dir.path() + "/r.yaml",
                                   "run_dir: run\ndata: {path: corpus, seq_len: 32}\nmodel: {max_seq_len: 32}\n"
                                   "train: {steps: 20, micro_batch_size: 2, global_batch_size: 2}\n");
  SECTION("nothing set: all three from corpus.json, each with that source") {
    const config::Recipe r = config::load_recipe(recipe);
    CHECK(r.data.format == config::DataFormat::kMegatron);
    CHECK(r.model.vocab_size == 257);
    CHECK(r.data.eos_token == 256);
    CHECK_THAT(r.sources.at("data.format"), Catch::Contains(dir.path() + "/corpus.json (prepare-data's description"));
    CHECK_THAT(r.sources.at("model.vocab_size"), Catch::Contains("corpus.json"));
    CHECK_THAT(r.sources.at("data.eos_token"), Catch::Contains("corpus.json"));
  }
  SECTION("what the recipe sets wins, and is still checked against the dataset") {
    const config::Recipe r = config::load_recipe(recipe, {"model.vocab_size=512"});
    CHECK(r.model.vocab_size == 512);
    CHECK(r.sources.at("model.vocab_size") == "--set");
    CHECK_THAT(load_error(recipe, {"model.vocab_size=200"}).what(),
               Catch::Contains("model.vocab_size: 200 is smaller than the vocabulary"));
    CHECK_THAT(load_error(recipe, {"data.eos_token=5"}).what(), Catch::Contains("data.eos_token: 5 is not the end-of-document token"));
  }
  SECTION("a Megatron dataset without its description, read as bytes: the error says to set data.format") {
    std::filesystem::remove(dir.path() + "/corpus.json");
    const Error e = load_error(recipe);
    CHECK(e.code() == ErrorCode::kData);
    CHECK_THAT(e.what(), Catch::Contains("'" + dir.path() + "/corpus.idx' and '" + dir.path() +
                                         "/corpus.bin' are a Megatron dataset: set data.format: megatron (data.format is bytes, default)"));
  }
}

TEST_CASE("model.init_from takes the model from the weights' config.json; model.hf_config takes a directory", "[config]") {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/hf");
  write(dir.path() + "/hf/config.json",
        R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 64, "rms_norm_eps": 1e-6})");
  write(dir.path() + "/data.txt", std::string(8192, 'x'));
  const std::string base =
      "run_dir: run\ndata: {path: data.txt, seq_len: 32}\ntrain: {steps: 20, micro_batch_size: 2, global_batch_size: 2}\n";
  SECTION("init_from alone: the sizes of hf/config.json, the source says why") {
    const config::Recipe r = config::load_recipe(write(dir.path() + "/r.yaml", base + "model: {init_from: hf}\n"));
    CHECK(r.model.hidden_size == 48);
    CHECK(r.model.num_layers == 3);
    CHECK(r.model.vocab_size == 300);
    CHECK(r.model.hf_config == dir.path() + "/hf/config.json");
    CHECK_THAT(r.sources.at("model.hf_config"), Catch::StartsWith("implied by model.init_from (" + dir.path() + "/r.yaml:"));
  }
  SECTION("init_from from --set, relative to the current directory") {
    struct InDir {
      std::filesystem::path was = std::filesystem::current_path();
      explicit InDir(const std::string& dir) { std::filesystem::current_path(dir); }
      ~InDir() { std::filesystem::current_path(was); }
    };
    config::Recipe r;
    {
      const InDir in(dir.path());
      r = config::load_recipe(write(dir.path() + "/r.yaml", base), {"model.init_from=hf"});
    }
    CHECK(r.model.hidden_size == 48);
  }
  SECTION("a size beside init_from overrides that field of config.json, in the recipe and in --set alike") {
    const config::Recipe r = config::load_recipe(write(dir.path() + "/r.yaml", base + "model: {init_from: hf, max_seq_len: 128}\n"));
    CHECK(r.model.max_seq_len == 128);
    CHECK(r.model.hidden_size == 48);  // the rest still from config.json
    CHECK(r.model.hf_config == dir.path() + "/hf/config.json");
    CHECK_THAT(r.sources.at("model.max_seq_len"), Catch::StartsWith(dir.path() + "/r.yaml:"));
    const auto over = config::model_keys_over_hf_config(r);
    REQUIRE(over.size() == 1);
    CHECK_THAT(over[0], Catch::StartsWith("model.max_seq_len 128 (" + dir.path() + "/r.yaml:"));
    const config::Recipe s =
        config::load_recipe(write(dir.path() + "/s.yaml", base + "model: {init_from: hf}\n"), {"model.max_seq_len=128"});
    CHECK(s.model.max_seq_len == 128);
    CHECK(s.model.num_layers == 3);
    CHECK(s.sources.at("model.max_seq_len") == "--set");
    CHECK_THAT(config::init_weights_hint(s),
               Catch::StartsWith("model.max_seq_len 128 (--set) overrides " + dir.path() + "/hf/config.json"));
    CHECK_THAT(config::init_weights_hint(config::load_recipe(dir.path() + "/s.yaml")),
               Catch::Contains("/hf/config.json does not describe the weights beside it"));
  }
  SECTION("with init_from, the optimizer a recipe leaves out is HF TrainingArguments', said as such; what it sets stays") {
    const config::Recipe r =
        config::load_recipe(write(dir.path() + "/r.yaml", base + "model: {init_from: hf}\noptimizer: {beta2: 0.98}\n"));
    CHECK(r.optimizer.lr == 5e-5);
    CHECK(r.optimizer.weight_decay == 0.0);
    CHECK(r.optimizer.beta2 == 0.98);
    CHECK(r.sources.at("optimizer.lr") == "fine-tuning default with model.init_from (HF TrainingArguments' learning_rate)");
    CHECK(r.sources.at("optimizer.weight_decay") == "fine-tuning default with model.init_from (HF TrainingArguments' weight_decay)");
    const config::Recipe p = config::load_recipe(write(dir.path() + "/p.yaml", base + "model: {hf_config: hf}\n"));
    CHECK(p.optimizer.lr == 3e-3);  // pretraining from config.json alone keeps pretraining's defaults
  }
  SECTION("a wrong recipe-relative path says paths are relative to the recipe, and which one exists") {
    std::filesystem::create_directories(dir.path() + "/sub");
    struct InDir {
      std::filesystem::path was = std::filesystem::current_path();
      explicit InDir(const std::string& dir) { std::filesystem::current_path(dir); }
      ~InDir() { std::filesystem::current_path(was); }
    };
    const InDir in(dir.path());
    const std::string what = load_error(write(dir.path() + "/sub/r.yaml", base + "model: {init_from: hf}\n")).what();
    CHECK_THAT(what, Catch::Contains("model.init_from: '" + dir.path() +
                                     "/sub/hf' is not a directory (a recipe's paths are relative to its "
                                     "own directory, " +
                                     dir.path() + "/sub; '" + dir.path() + "/hf' from the current directory exists: write ../hf)"));
  }
  SECTION("hf_config names the directory") {
    const config::Recipe r = config::load_recipe(write(dir.path() + "/r.yaml", base + "model: {hf_config: hf}\n"));
    CHECK(r.model.num_layers == 3);
    CHECK(r.model.hf_config == dir.path() + "/hf/config.json");
  }
  SECTION("a directory without config.json") {
    std::filesystem::create_directories(dir.path() + "/empty");
    CHECK_THAT(load_error(write(dir.path() + "/r.yaml", base + "model: {hf_config: empty}\n")).what(),
               Catch::Contains("empty/config.json' does not exist or is not a file (give a config.json or the model directory"));
  }
}

TEST_CASE("Hugging Face's stock ds_config_zero2.json: every open \"auto\" at once, TrainingArguments' defaults for the rest", "[config]") {
  test::TempDir dir;
  write(dir.path() + "/data.txt", std::string(8192, 'x'));
  // transformers' tests/deepspeed/ds_config_zero2.json, as HF Trainer users have it.
  write(dir.path() + "/ds_config_zero2.json", R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "allgather_partitions": true,
      "allgather_bucket_size": 2e8, "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8, "contiguous_gradients": true},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
})");
  const std::string base =
      "run_dir: run\nds_config: ds_config_zero2.json\ndata: {path: data.txt, seq_len: 32}\nmodel: {max_seq_len: 32}\n"
      "train: {steps: 20, micro_batch_size: 2}\n";
  SECTION("the recipe sets nothing: pretraining's lr is the one error; precision and warmup are HF's defaults") {
    const Error e = load_error(write(dir.path() + "/r.yaml", base));
    const std::string what = e.what();
    CHECK(e.code() == ErrorCode::kConfig);
    CHECK_THAT(what, Catch::Contains("1 problem in the configuration"));
    CHECK_THAT(what, Catch::Contains("optimizer.params.lr and scheduler.params.warmup_max_lr are \"auto\", but the recipe does not set "
                                     "optimizer.lr"));
    CHECK_THAT(what, Catch::Contains("HF TrainingArguments' learning_rate defaults to 5e-05"));
    for (const char* filled : {"params.betas", "params.eps", "params.weight_decay", "gradient_clipping", "precision", "warmup_num_steps"})
      CHECK_THAT(what, !Catch::Contains(filled));
  }
  SECTION("with only lr set: fp32 and no warmup, as HF's TrainingArguments fill the \"auto\"s, each with that source") {
    const config::Recipe r = config::load_recipe(write(dir.path() + "/r.yaml", base + "optimizer: {lr: 2.0e-5}\n"));
    CHECK(r.precision.dtype == config::Dtype::kFp32);
    CHECK_THAT(r.sources.at("precision.dtype"),
               Catch::Contains("fp16.enabled and bf16.enabled are \"auto\" and the recipe sets no precision.dtype: fp32, as HF "
                               "TrainingArguments' fp16/bf16 default to False"));
    CHECK(r.schedule.warmup_steps == 0);
    CHECK_THAT(r.sources.at("schedule.warmup_steps"), Catch::Contains("the default of HF TrainingArguments' warmup_steps"));
  }
  SECTION("with those three set it runs, with HF's optimizer defaults and its sources; steps_per_print is said once") {
    const config::Recipe r = config::load_recipe(
        write(dir.path() + "/r.yaml", base + "precision: {dtype: bf16}\noptimizer: {lr: 2.0e-5}\nschedule: {warmup_steps: 2}\n"));
    CHECK(r.optimizer.beta1 == 0.9);
    CHECK(r.optimizer.beta2 == 0.999);
    CHECK(r.optimizer.eps == 1e-8);
    CHECK(r.optimizer.weight_decay == 0.0);
    CHECK(r.train.grad_clip == 1.0);
    CHECK_THAT(r.sources.at("optimizer.beta2"), Catch::Contains("ds_config_zero2.json:") &&
                                                    Catch::Contains("(\"auto\": 0.999, the default of HF TrainingArguments' adam_beta2)"));
    CHECK_THAT(r.sources.at("train.grad_clip"), Catch::Contains("max_grad_norm"));
    CHECK(r.optimizer.lr == 2e-5);
    int said = 0;
    for (const auto& w : r.warnings) {
      said += w.find("logging.steps_per_print 2000") != std::string::npos;
      CHECK_THAT(w, !Catch::Contains("loss scaling"));  // the template's fp16 block waits for whoever picks fp16
    }
    CHECK(said == 1);
  }
  SECTION("a value the recipe sets fills its \"auto\" instead of HF's default") {
    const config::Recipe r = config::load_recipe(
        write(dir.path() + "/r.yaml",
              base + "precision: {dtype: bf16}\noptimizer: {lr: 2.0e-5, weight_decay: 0.1}\nschedule: {warmup_steps: 2}\n"));
    CHECK(r.optimizer.weight_decay == 0.1);
    CHECK_THAT(r.sources.at("optimizer.weight_decay"), Catch::Contains("filled into \"auto\""));
  }
}

TEST_CASE("--dry-run shows the keys the run uses, and every key something set", "[config]") {
  const config::Recipe dense = config::load_recipe(test::source_dir() + "/recipes/demo.yaml");
  const std::string text = cost::describe_resolved(dense);
  CHECK_THAT(text, Catch::Contains("model.hidden_size") && Catch::Contains("zero.stage") && Catch::Contains("optimizer.lr"));
  for (const char* unused : {"model.kv_lora_rank", "model.n_routed_experts", "precision.loss_scale", "zero.stage3_prefetch_bucket_size",
                             "schedule.cycle_min_lr", "model.rope_beta_fast", "data.paths"})
    CHECK_THAT(text, !Catch::Contains(std::string("  ") + unused + " "));
  CHECK_THAT(text, Catch::Contains("keys that this run does not use are not shown"));
  // Set, it is shown even where it does not apply (the warning says so).
  const config::Recipe set = config::load_recipe(test::source_dir() + "/recipes/demo.yaml", {"precision.hysteresis=4"});
  CHECK_THAT(cost::describe_resolved(set), Catch::Contains("precision.hysteresis"));
  const config::Recipe moe = config::load_recipe(test::source_dir() + "/recipes/tiny-mla-moe.yaml");
  CHECK_THAT(cost::describe_resolved(moe), Catch::Contains("model.n_routed_experts") && !Catch::Contains("model.num_kv_heads "));
  CHECK(std::count(text.begin(), text.end(), '\n') < 110);  // was 163 lines for this 50-line recipe
}
