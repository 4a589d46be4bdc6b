// --set applies to every key of the schema, the files the recipe reads (ds_config,
// model.hf_config) included: one row per key, each set through --set on a small recipe and read
// back from the resolved config. A key added to the schema is covered by the generic value for
// its type, or fails here until it gets a row below.
#include "catch_torch.h"
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dstrain/config/assign.h"
#include "dstrain/config/node.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/error.h"
#include "test_support.h"

using namespace dstrain;

namespace {

struct Row {
  std::string value;                    // what --set gives
  std::vector<std::string> companions;  // other --set the value needs to resolve
  std::string recipe = "recipe.yaml";   // the recipe it is set on
};

const char* kRecipe =
    "run_dir: run\n"
    "data: {path: data.txt, seq_len: 16}\n"
    "model: {hidden_size: 32, num_heads: 4, intermediate_size: 64, max_seq_len: 32, vocab_size: 256}\n"
    "train: {steps: 10, micro_batch_size: 2}\n"
    "launch: {nproc_per_node: 1}\n";

// A value for a field of the generic kinds: a number next to the default and within range, the
// other boolean, the second enum name.
std::string generic_value(const config::Field& f) {
  config::Recipe defaults;
  const config::FieldTarget target = f.target(defaults);
  if (auto* p = std::get_if<int64_t*>(&target)) return std::to_string(**p + 1 <= f.max ? **p + 1 : **p - 1);
  if (auto* p = std::get_if<uint64_t*>(&target)) return std::to_string(**p + 1);
  if (auto* p = std::get_if<double*>(&target)) {
    const double v = **p > 0 ? **p / 2 : std::min(0.5, f.max);
    return fmt::format("{}", v);
  }
  if (auto* p = std::get_if<bool*>(&target)) return **p ? "false" : "true";
  if (std::holds_alternative<config::EnumTarget>(target)) return f.choices.at(1);
  if (std::holds_alternative<config::EnumListTarget>(target)) return "[" + f.choices.at(2) + "]";
  return "";
}

std::map<std::string, Row> special_rows(const std::string& dir) {
  return {
      {"run_dir", {dir + "/another-run", {}}},
      {"ds_config", {dir + "/ds.json", {}}},
      {"model.hf_config", {dir + "/hf/config.json", {}, "recipe-no-model.yaml"}},  // sizes come from the HF config only
      {"model.init_from", {dir + "/hf", {}}},
      {"model.family",
       {"mla_moe",
        {"model.kv_lora_rank=16", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4", "model.v_head_dim=8",
         "model.moe_intermediate_size=16", "model.n_routed_experts=4", "model.num_experts_per_tok=2", "model.n_shared_experts=1"}}},
      {"model.hidden_size", {"64", {}}},
      {"model.num_heads", {"8", {}}},
      {"model.qk_rope_head_dim", {"32", {}}},
      {"model.topk_method", {"group_limited_greedy", {}}},
      {"model.n_group", {"2", {}}},
      {"model.topk_group", {"2", {"model.n_group=2"}}},
      {"zero.delayed_update", {"true", {"zero.stage=2", "zero.offload_optimizer=cpu"}}},
      {"model.mtp_depth",
       {"2",
        {"model.family=mla_moe", "model.kv_lora_rank=16", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4", "model.v_head_dim=8",
         "model.moe_intermediate_size=16", "model.n_routed_experts=4", "model.num_experts_per_tok=2", "model.n_shared_experts=1"}}},
      {"moe.expert_parallel_size",
       {"2", {"model.family=mla_moe", "model.n_routed_experts=4", "model.num_experts_per_tok=2", "launch.nproc_per_node=2"}}},
      {"parallel.pipeline_parallel_size", {"2", {"launch.nproc_per_node=2", "train.gradient_accumulation_steps=2"}}},
      {"parallel.sequence_parallel_size", {"2", {"launch.nproc_per_node=2"}}},
      {"pipeline.schedule",
       {"zb_h1", {"parallel.pipeline_parallel_size=2", "launch.nproc_per_node=2", "train.gradient_accumulation_steps=2"}}},
      {"pipeline.virtual_stages",
       {"2",
        {"parallel.pipeline_parallel_size=2", "launch.nproc_per_node=2", "train.gradient_accumulation_steps=2", "model.num_layers=4",
         "pipeline.schedule=interleaved_1f1b"}}},
      {"pipeline.layers_per_stage",
       {"[1, 1]", {"parallel.pipeline_parallel_size=2", "launch.nproc_per_node=2", "train.gradient_accumulation_steps=2"}}},
      {"data.path", {dir + "/other.txt", {}}},
      {"data.seq_len", {"17", {}}},
      {"data.document_mask", {"true", {"data.eos_token=0"}}},
      {"data.reset_positions", {"true", {"data.eos_token=0"}}},
      {"schedule.warmup_steps", {"5", {}}},
      {"train.steps", {"12", {}}},
      {"data.paths", {"[" + dir + "/data.txt, " + dir + "/other.txt]", {"data.path="}}},
      {"data.weights", {"[3, 1]", {"data.path=", "data.paths=[" + dir + "/data.txt, " + dir + "/other.txt]"}}},
      {"data.format", {"raw_u16", {}}},
      {"data.shard_weights", {"[2]", {}}},
      {"data.auto_balance", {"true", {"launch.nproc_per_node=2"}}},
      {"train.tokens", {"640", {"train.steps=0"}}},
      {"train.global_batch_size", {"4", {}}},
      {"train.gradient_accumulation_steps", {"3", {}}},
      {"train.freeze", {"[model.embed_tokens.*, norms]", {}}},
      {"lora.alpha", {"4", {"lora.rank=4"}}},
      {"lora.dropout", {"0.05", {"lora.rank=4"}}},
      {"lora.targets", {"[q_proj, v_proj]", {"lora.rank=4"}}},
      {"lora.use_rslora", {"true", {"lora.rank=4"}}},
      {"lora.use_dora", {"true", {"lora.rank=4"}}},
      {"lora.base", {"nf4", {"lora.rank=4"}}},
      {"lora.modules_to_save", {"[lm_head]", {"lora.rank=4"}}},
      {"lora.rank_pattern", {"{q_proj: 8}", {"lora.rank=4"}}},
      {"lora.alpha_pattern", {"{'layers\\.0\\..*o_proj': 2.5}", {"lora.rank=4"}}},
      {"lora.init_from", {dir + "/adapter", {"lora.rank=4", "lora.alpha=8"}}},
      {"lora.experts",
       {"true",
        {"lora.rank=4", "model.family=mla_moe", "model.kv_lora_rank=16", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
         "model.v_head_dim=8", "model.moe_intermediate_size=16", "model.n_routed_experts=4", "model.num_experts_per_tok=2",
         "model.n_shared_experts=1"}}},
      {"train.accumulation", {"[{until_step: 5, steps: 2}, {steps: 3}]", {}}},
      {"train.batch_ramp_start", {"2", {"train.global_batch_size=8", "train.batch_ramp_steps=4"}}},
      {"train.batch_ramp_steps", {"4", {"train.global_batch_size=8", "train.batch_ramp_start=2"}}},
      {"train.batch_ramp_tokens", {"256", {"train.global_batch_size=8", "train.batch_ramp_start=2"}}},
      {"zero.offload_optimizer", {"cpu", {"zero.stage=1"}}},
      {"checkpoint.dir", {dir + "/ckpts", {}}},
      {"logging.tensorboard_dir", {dir + "/tb", {}}},
      {"logging.csv_dir", {dir + "/csv", {}}},
      {"logging.python", {"/opt/venv/bin/python", {}}},
      {"logging.run_name", {"my-run", {}}},
      {"logging.wandb_project", {"proj", {}}},
      {"logging.wandb_entity", {"team", {}}},
      {"logging.wandb_group", {"group", {}}},
      {"logging.mlflow_experiment", {"exp", {}}},
      {"launch.master_addr", {"10.1.2.3", {}}},
      {"launch.node_rank", {"1", {"launch.nnodes=2"}}},
      {"eval.paths", {"[" + dir + "/other.txt]", {}}},
      {"eval.names", {"[held]", {"eval.paths=[" + dir + "/other.txt]"}}},
      {"eval.tasks", {"[" + dir + "/other.txt]", {}}},
      {"eval.task_format", {"arc", {"eval.tasks=[" + dir + "/other.txt]"}}},
      {"eval.samples", {dir + "/other.txt", {}}},
      {"eval.task_batch_size", {"4", {"eval.tasks=[" + dir + "/other.txt]"}}},
      {"eval.sample_tokens", {"8", {"eval.samples=" + dir + "/other.txt"}}},
      {"eval.sample_temperature", {"0.7", {"eval.samples=" + dir + "/other.txt"}}},
      {"eval.split", {"0.25", {"data.eos_token=0"}}},
      {"data.packing", {"none", {}}},
      {"train.epochs", {"0", {}}},  // a length in epochs needs a fine-tuning set (dist.finetune sets it)  // another value needs a
                                    // fine-tuning set (dist.finetune sets it)
      {"eval.interval_steps", {"5", {"eval.paths=[" + dir + "/other.txt]"}}},
      {"eval.at_start", {"true", {"eval.paths=[" + dir + "/other.txt]"}}},
      {"eval.early_stopping_patience", {"2", {"eval.paths=[" + dir + "/other.txt]", "eval.interval_steps=5"}}},
      {"checkpoint.at_end", {"false", {}}},
      {"checkpoint.keep_best", {"true", {"eval.paths=[" + dir + "/other.txt]", "eval.interval_steps=5"}}},
      // train.objective dpo reads a prepare-data --preference set (the config reads its PREFIX.json alone).
      {"train.objective", {"dpo", {"data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.beta", {"0.5", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.loss_type", {"[ipo, hinge]", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.loss_weights", {"[2]", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.label_smoothing", {"0.1", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.discopop_tau",
       {"0.2", {"train.objective=dpo", "preference.loss_type=[discopop]", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.f_divergence_type", {"js_divergence", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.ld_alpha", {"0.5", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.use_weighting", {"true", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.reference", {"none", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.cpo_alpha", {"0.5", {"train.objective=cpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.simpo_gamma", {"1.0", {"train.objective=simpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.alpha", {"0.25", {"train.objective=simpo", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"preference.center_rewards_coefficient",
       {"0.01", {"train.objective=reward", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      {"model.score_head", {"true", {"train.objective=reward", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
      // train.objective kto reads a prepare-data --preference --kto set.
      {"preference.desirable_weight", {"1.3", {"train.objective=kto", "data.path=" + dir + "/kto", "data.format=megatron"}}},
      {"preference.sync_ref_model",
       {"true", {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron", "preference.reference=live"}}},
      {"preference.ref_model_mixup_alpha",
       {"0.5",
        {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron", "preference.reference=live",
         "preference.sync_ref_model=true"}}},
      {"preference.ref_model_sync_steps",
       {"7",
        {"train.objective=dpo", "data.path=" + dir + "/pairs", "data.format=megatron", "preference.reference=live",
         "preference.sync_ref_model=true"}}},
      {"preference.undesirable_weight", {"0.7", {"train.objective=kto", "data.path=" + dir + "/kto", "data.format=megatron"}}},
      {"preference.f_alpha_divergence_coef",
       {"0.3",
        {"train.objective=dpo", "preference.f_divergence_type=alpha_divergence", "data.path=" + dir + "/pairs", "data.format=megatron"}}},
  };
}

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("--set applies to every schema key, and the resolved config keeps the value", "[config]") {
  test::TempDir dir;
  const std::string d = dir.path();
  write(d + "/recipe.yaml", kRecipe);
  write(d + "/recipe-no-model.yaml",
        "run_dir: run\ndata: {path: data.txt, seq_len: 16}\ntrain: {steps: 10, micro_batch_size: 2}\n"
        "launch: {nproc_per_node: 1}\n");
  write(d + "/data.txt", std::string(4096, 'a'));
  write(d + "/other.txt", std::string(4096, 'b'));
  write(d + "/ds.json", R"({"steps_per_print": 7})");
  write(d + "/kto.bin", ""), write(d + "/kto.idx", "");
  write(d + "/kto.json", R"({"format": "megatron", "vocab_size": 256, "eos": 1, "loss_mask": {"bytes": 26, "trained_tokens": 4},
                             "kto": {"examples": 2, "labels": "10", "longest_sequence": 8}})");
  write(d + "/pairs.bin", ""), write(d + "/pairs.idx", "");
  write(d + "/pairs.json", R"({"format": "megatron", "vocab_size": 256, "eos": 1, "loss_mask": {"bytes": 26, "trained_tokens": 4},
                               "preference": {"pairs": 2, "longest_sequence": 8}})");
  write(d + "/adapter/adapter_config.json", R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": false})");
  write(d + "/adapter/adapter_model.safetensors", "");  // the config reads adapter_config.json alone
  write(d + "/hf/config.json",
        R"({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
            "vocab_size": 256, "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0})");
  const auto rows = special_rows(d);
  for (const auto& field : config::recipe_schema()) {
    const auto special = rows.find(field.path);
    const Row row = special != rows.end() ? special->second : Row{generic_value(field), {}};
    DYNAMIC_SECTION(field.path) {
      INFO("--set " << field.path << "=" << row.value);
      REQUIRE_FALSE(row.value.empty());  // a new string or list key: give it a row in special_rows()
      std::vector<std::string> overrides = row.companions;
      overrides.push_back(field.path + "=" + row.value);
      config::Recipe recipe;
      try {
        recipe = config::load_recipe(d + "/" + row.recipe, overrides);
      } catch (const Error& e) {
        FAIL(e.what());
      }
      // What the value reads as on its own, through the same schema row.
      std::vector<std::string> problems;
      const config::Node node = config::parse_yaml(row.value, "--set", problems);
      config::Recipe probe;
      REQUIRE(config::assign_node(field, node, probe, false).empty());
      CHECK(config::value_text(field, recipe) == config::value_text(field, probe));
      CHECK(recipe.sources.at(field.path) == "--set");
    }
  }
}

TEST_CASE("--set ds_config and model.hf_config are read instead of the recipe's files", "[config]") {
  test::TempDir dir;
  const std::string d = dir.path();
  write(d + "/recipe.yaml", std::string(kRecipe) + "ds_config: ds-recipe.json\n");
  write(d + "/data.txt", std::string(4096, 'a'));
  write(d + "/ds-recipe.json", R"({"zero_optimization": {"stage": 2}})");
  write(d + "/ds-set.json",
        R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(d);  // a --set path is relative to the current directory
  config::Recipe r;
  try {
    r = config::load_recipe("recipe.yaml", {"ds_config=ds-set.json"});
  } catch (...) {
    std::filesystem::current_path(cwd);
    throw;
  }
  std::filesystem::current_path(cwd);
  CHECK(r.ds_config_path == d + "/ds-set.json");
  CHECK(r.precision.dtype == config::Dtype::kBf16);
  CHECK(r.zero.stage == 1);
  CHECK(r.optimizer.lr == 1e-3);
  CHECK(r.sources.at("zero.stage").find("ds-set.json") != std::string::npos);
}

TEST_CASE("--set model.hf_config takes the model's sizes from that file", "[config]") {
  test::TempDir dir;
  const std::string d = dir.path();
  write(d + "/recipe.yaml",
        "run_dir: run\ndata: {path: data.txt, seq_len: 16}\ntrain: {steps: 10, micro_batch_size: 2}\nlaunch: {nproc_per_node: 1}\n");
  write(d + "/data.txt", std::string(4096, 'a'));
  write(d + "/hf/config.json",
        R"({"model_type": "llama", "hidden_size": 48, "num_attention_heads": 4, "num_hidden_layers": 3, "intermediate_size": 96,
            "vocab_size": 300, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0})");
  const config::Recipe r = config::load_recipe(d + "/recipe.yaml", {"model.hf_config=" + d + "/hf/config.json"});
  CHECK(r.model.hidden_size == 48);
  CHECK(r.model.num_layers == 3);
  CHECK(r.model.vocab_size == 300);
  CHECK(r.model.rope_theta == 500000.0);
  CHECK(r.sources.at("model.hidden_size").find("config.json") != std::string::npos);
}
