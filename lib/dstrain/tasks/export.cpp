#include "dstrain/tasks/export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "dstrain/ckpt/base_model.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/tasks/run_checkpoint.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/load_context.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/tasks/peft_export.h"
#include "dstrain/text/byte_level.h"
#include "dstrain/text/tokenizer.h"
#include "dstrain/config/dataset_sidecar.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;
namespace {

// Tensors of the checkpoint that are the model's (parameters and buffers): not the optimizer's,
// the engine's or the data's.
bool is_model_tensor(const std::string& name) {
  for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "engine.", "data.", "eval.", "preference."})
    if (name.rfind(prefix, 0) == 0) return false;
  return true;
}

// --checkpoint: a checkpoint directory, or a step as eval's --step takes it ("best", a number).
std::string checkpoint_of(const run::RunDir& run_dir, const config::Recipe& recipe, const std::string& given) {
  if (!given.empty() && fs::exists(given)) return given;
  const bool step =
      given == "best" || (!given.empty() && std::all_of(given.begin(), given.end(), [](char c) { return c >= '0' && c <= '9'; }));
  if (!given.empty() && !step)
    throw Error(ErrorCode::kUsage,
                fmt::format("--checkpoint '{}' is neither a checkpoint directory nor a step ('best' or a number)", given),
                "pass a directory under the run's ckpt/, a step number, or best");
  return run_checkpoint(run_dir.root(), run_dir.ckpt_dir(recipe), given, "--checkpoint");
}

model::HfExportOptions hf_options(const ExportOptions& options) {
  model::HfExportOptions o;
  static const std::map<std::string, std::string> kDtypes = {{"fp32", "F32"}, {"bf16", "BF16"}, {"fp16", "F16"}, {"fp8", "F8_E4M3"}};
  const auto dtype = kDtypes.find(options.dtype);
  if (dtype == kDtypes.end())
    throw Error(ErrorCode::kUsage, fmt::format("--dtype {} is not fp32, bf16, fp16 or fp8", options.dtype), "pick one of the four");
  o.dtype = dtype->second;
  if (!options.scale_fmt.empty() && (options.dtype != "fp8" || options.scale_fmt != "ue8m0"))
    throw Error(ErrorCode::kUsage, fmt::format("--scale-fmt {} with --dtype {}", options.scale_fmt, options.dtype),
                "--scale-fmt ue8m0 (power-of-two block scales) goes with --dtype fp8");
  o.fp8.ue8m0 = options.scale_fmt == "ue8m0";
  o.mtp = options.mtp;
  o.max_shard_bytes = model::parse_byte_size(options.max_shard_size);
  return o;
}

void check_out_dir(const std::string& out_dir) {
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' exists and is not a directory", out_dir),
                "name a new or existing directory to write the model into");
}

// A tokenizer.json whose ids are the bytes (byte b is token b), with `eos` as the special token
// that ends a document when there is one.
void write_byte_tokenizer(const std::string& out_dir, std::optional<int64_t> eos, int64_t max_length) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[text::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  nlohmann::json added = nlohmann::json::array();
  if (eos)
    added.push_back({{"id", *eos},
                     {"content", "<|endoftext|>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const nlohmann::json tokenizer = {{"version", "1.0"},
                                    {"truncation", nullptr},
                                    {"padding", nullptr},
                                    {"added_tokens", added},
                                    {"normalizer", nullptr},
                                    {"pre_tokenizer", byte_level},
                                    {"post_processor", nullptr},
                                    {"decoder", byte_level},
                                    {"model",
                                     {{"type", "BPE"},
                                      {"dropout", nullptr},
                                      {"unk_token", nullptr},
                                      {"continuing_subword_prefix", nullptr},
                                      {"end_of_word_suffix", nullptr},
                                      {"fuse_unk", false},
                                      {"byte_fallback", false},
                                      {"ignore_merges", false},
                                      {"vocab", vocab},
                                      {"merges", nlohmann::json::array()}}}};
  nlohmann::json config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", max_length}, {"clean_up_tokenization_spaces", false}};
  nlohmann::json special = nlohmann::json::object();
  if (eos) config["eos_token"] = "<|endoftext|>", special["eos_token"] = "<|endoftext|>";
  write_file_atomic(out_dir + "/tokenizer.json", tokenizer.dump(2) + "\n");
  write_file_atomic(out_dir + "/tokenizer_config.json", config.dump(2) + "\n");
  write_file_atomic(out_dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

// The dataset's own description (prepare-data writes PREFIX.json next to PREFIX.bin/.idx).
std::optional<config::DatasetSidecar> dataset_sidecar(const config::Recipe& r) {
  return config::read_dataset_sidecar(r.data.sources().front());
}

struct Tokens {
  std::optional<int64_t> bos, eos, end_of_turn, pad;
  std::string tokenizer;  // where it comes from
};

// prepare-data's copy of a Hugging Face tokenizer, with its special ids (and a fine-tuning set's
// end of turn); a tokenizer_config.json for transformers when the tokenizer came without one.
std::string copy_dataset_tokenizer(const config::DatasetSidecar& sidecar, const std::string& out_dir, int64_t max_length, Tokens& t) {
  const auto tokenizer = text::Tokenizer::load(sidecar.tokenizer_dir);
  for (const auto& file : tokenizer->files())
    fs::copy_file(file, fs::path(out_dir) / fs::path(file).filename(), fs::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::object();
  const auto config_path = fs::path(sidecar.tokenizer_dir) / "tokenizer_config.json";
  if (fs::is_regular_file(config_path)) config = nlohmann::json::parse(read_file(config_path.string()), nullptr, false);
  if (!config.is_object()) config = nlohmann::json::object();
  const auto id_of = [&](const char* key) -> std::optional<int64_t> {
    if (!config.contains(key)) return std::nullopt;
    const auto& v = config.at(key);
    const auto& content = v.is_object() && v.contains("content") ? v.at("content") : v;
    if (!content.is_string()) return std::nullopt;
    if (auto id = tokenizer->token_id(content.get<std::string>())) return int64_t{*id};
    return std::nullopt;
  };
  if (!t.bos) t.bos = id_of("bos_token");
  if (!t.pad) t.pad = id_of("pad_token");
  if (!t.eos) t.eos = sidecar.eos >= 0 ? std::optional<int64_t>(sidecar.eos) : id_of("eos_token");
  if (!sidecar.end_of_turn.empty())
    if (auto id = tokenizer->token_id(sidecar.end_of_turn)) t.end_of_turn = int64_t{*id};
  if (!fs::is_regular_file(config_path)) {
    config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", max_length}, {"clean_up_tokenization_spaces", false}};
    if (t.eos) config["eos_token"] = tokenizer->decode({static_cast<uint32_t>(*t.eos)});
    write_file_atomic(out_dir + "/tokenizer_config.json", config.dump(2) + "\n");
  }
  return fmt::format("the tokenizer the data was prepared with ({}, sha256 {})", sidecar.tokenizer_dir,
                     sidecar.tokenizer_sha256.substr(0, 12));
}

// A Hugging Face folder's bos and eos ids (config.json), where `t` has none yet.
void read_special_ids(const std::string& from, Tokens& t) {
  if (from.empty() || !fs::is_regular_file(from + "/config.json")) return;
  const auto cfg = nlohmann::json::parse(read_file(from + "/config.json"), nullptr, false);
  if (!cfg.is_object()) return;
  if (!t.bos && cfg.contains("bos_token_id") && cfg["bos_token_id"].is_number_integer()) t.bos = cfg["bos_token_id"].get<int64_t>();
  if (!t.eos && cfg.contains("eos_token_id") && cfg["eos_token_id"].is_number_integer()) t.eos = cfg["eos_token_id"].get<int64_t>();
  if (!t.pad && cfg.contains("pad_token_id") && cfg["pad_token_id"].is_number_integer()) t.pad = cfg["pad_token_id"].get<int64_t>();
}

// A Hugging Face folder's tokenizer files into out_dir; false when it has none.
bool copy_tokenizer_files(const std::string& from, const std::string& out_dir) {
  bool copied = false;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
                           "vocab.json", "merges.txt"})
    if (!from.empty() && fs::is_regular_file(fs::path(from) / file))
      fs::copy_file(fs::path(from) / file, fs::path(out_dir) / file, fs::copy_options::overwrite_existing), copied = true;
  return copied;
}

// The special ids and the tokenizer: the recipe's eos_token, prepare-data's byte vocabulary, or
// the files of the model the run started from. A run on fine-tuning sets ships the tokenizer its
// conversations were prepared with: prepare-data's copy carries the chat template that rendered
// them (the model it started from may have another, or none).
Tokens write_tokenizer(const config::Recipe& r, const std::string& out_dir) {
  Tokens t;
  if (r.data.eos_token >= 0) t.eos = r.data.eos_token;
  const std::string from = r.model.init_from;
  read_special_ids(from, t);
  const auto sidecar = dataset_sidecar(r);
  const bool dataset_tokenizer = sidecar && sidecar->tokenizer == "huggingface" && !sidecar->tokenizer_dir.empty();
  if (dataset_tokenizer && sidecar->lossmask_bytes >= 0)
    return t.tokenizer = copy_dataset_tokenizer(*sidecar, out_dir, r.data.seq_len, t) + " and the chat template it rendered with", t;
  if (copy_tokenizer_files(from, out_dir)) return t.tokenizer = "the files of " + from, t;
  if (dataset_tokenizer) return t.tokenizer = copy_dataset_tokenizer(*sidecar, out_dir, r.data.seq_len, t), t;
  const bool byte_dataset = sidecar && sidecar->tokenizer == "bytes+eos";
  if (byte_dataset && !t.eos) t.eos = sidecar->eos >= 0 ? sidecar->eos : int64_t{256};
  if (byte_dataset || r.data.format == config::DataFormat::kBytes) {
    write_byte_tokenizer(out_dir, t.eos, r.data.seq_len);
    t.tokenizer = "byte-level (token b is byte b" + std::string(t.eos ? fmt::format(", {} ends a document)", *t.eos) : ")");
  }
  return t;
}

// The model's tensors an export writes: the checkpoint's (not the adapters), and with a base the
// checkpoint names, the frozen ones from there. Throws Error{kCheckpoint} when they are not the
// run's model.
std::vector<model::TensorShape> model_tensors_of(const config::Recipe& recipe, const ckpt::Reader& reader, const model::HfWeights* base) {
  std::vector<model::TensorShape> tensors;
  int64_t elements = 0;
  const auto take = [&](const std::string& name, const std::vector<int64_t>& shape) {
    tensors.push_back({name, shape});
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    elements += n;
  };
  for (const auto& t : reader.tensors())
    if (is_model_tensor(t.name) && !is_adapter_tensor(t.name)) take(t.name, t.shape);
  if (base)
    for (const auto& s : model::model_tensor_shapes(recipe.model))
      if (!reader.find(s.name) && (s.required || base->has(s.name))) take(s.name, s.shape);
  const int64_t expected = cost::parameter_counts(recipe.model).total;
  if (elements != expected)
    throw Error(ErrorCode::kCheckpoint,
                fmt::format("checkpoint {} holds {} model elements{}, the run's model has {}", reader.dir(), elements,
                            base ? " with its base's" : "", expected),
                "export with the run directory that wrote the checkpoint");
  return tensors;
}

bool is_hf_folder(const std::string& dir) {
  return fs::is_regular_file(dir + "/config.json") &&
         (fs::is_regular_file(dir + "/model.safetensors") || fs::is_regular_file(dir + "/model.safetensors.index.json"));
}

// A Hugging Face folder into another dtype: FP8 dequantized, or quantized, one tensor at a time.
ExportResult export_hf_folder(const std::string& from, const std::string& out_dir, const model::HfExportOptions& o) {
  if (fs::exists(out_dir) && fs::equivalent(from, out_dir))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' is both the model to read and the directory to write", from),
                "write the converted model into another directory");
  const config::ModelConfig model = model_of_hf_folder(from);
  const auto shapes = model::model_tensor_shapes(model);
  model::check_hf_weights(from, shapes);
  const model::HfWeights weights(from, model);
  std::vector<model::TensorShape> tensors;
  for (const auto& s : shapes)
    if (s.required || weights.has(s.name)) tensors.push_back({s.name, s.shape});
  ExportResult result;
  result.checkpoint = "Hugging Face model " + from;
  fs::create_directories(out_dir);
  Tokens tokens;
  read_special_ids(from, tokens);
  if (copy_tokenizer_files(from, out_dir)) result.tokenizer = "the files of " + from;
  model::HfExportOptions with_ids = o;
  with_ids.bos_token_id = tokens.bos, with_ids.eos_token_id = tokens.eos;
  if (model.score_head) with_ids.pad_token_id = tokens.pad ? tokens.pad : tokens.eos;
  result.files = model::export_hf_streaming(
      model, tensors, [&](const model::TensorShape& t) { return weights.read(t.name); }, with_ids, out_dir);
  return result;
}

}  // namespace

// The recipe around the model is a placeholder: an export trains nothing. A sequence classifier's
// folder reads as a reward model's (train.objective reward sets model.score_head).
config::ModelConfig model_of_hf_folder(const std::string& dir) {
  std::vector<std::string> sets = {"model.init_from=" + dir,
                                   "run_dir=" + (fs::temp_directory_path() / "dstrain-export").string(),
                                   "data.path=" + (fs::temp_directory_path() / "dstrain-export" / "none").string(),
                                   "data.format=megatron",
                                   "data.seq_len=1",
                                   "train.micro_batch_size=1",
                                   "train.steps=1",
                                   "schedule.warmup_steps=0",
                                   "logging.steps_per_print=1"};
  if (!model::hf_sequence_classifier(dir).empty()) sets.push_back("train.objective=reward");
  const std::string name = "dstrain export-hf " + dir;
  config::LoadOptions options;
  options.data_may_be_missing = true;
  const config::Recipe recipe = config::load_recipe_with(
      name, sets,
      [&](const std::string& path) -> std::optional<std::string> {
        if (path == name) return std::string();
        if (!fs::is_regular_file(path)) return std::nullopt;
        return read_file(path);
      },
      {}, options);
  for (const auto& w : recipe.warnings)
    if (w.find("training data:") == std::string::npos) log::warn(w);
  return recipe.model;
}

ExportResult export_run_to_hf(const std::string& run_path, const std::string& out_dir, const ExportOptions& options) {
  const run::RunDir run_dir(run_path);
  check_out_dir(out_dir);
  model::HfExportOptions o = hf_options(options);
  if (!fs::is_regular_file(run_dir.config_path()) && is_hf_folder(run_path)) {
    if (!options.checkpoint.empty())
      throw Error(ErrorCode::kUsage, fmt::format("--checkpoint with a Hugging Face folder ({})", run_path),
                  "--checkpoint picks a checkpoint of a run directory; a folder has only its weights");
    return export_hf_folder(run_path, out_dir, o);
  }
  if (!fs::is_regular_file(run_dir.config_path()))
    throw Error(ErrorCode::kUsage,
                fmt::format("'{}' is neither a dstrain run directory (no config.resolved.json) nor a Hugging Face folder (config.json and "
                            "model.safetensors or its index)",
                            run_path),
                "pass the run_dir of a `dstrain train`, or a Hugging Face model folder to convert");
  const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
  ExportResult result;
  result.checkpoint = checkpoint_of(run_dir, recipe, options.checkpoint);
  const ckpt::Reader reader(result.checkpoint);
  if (options.merge && !recipe.lora.enabled())
    throw Error(ErrorCode::kUsage,
                fmt::format("--merge: run {} trained no adapters (lora.rank 0); its export is the whole model already", run_path),
                "leave --merge out");
  // A LoRA checkpoint that names its base: the frozen weights from there (checked before anything
  // is written), in the model's dtype as the run held them.
  const bool adapter = recipe.lora.enabled() && !options.merge;
  std::unique_ptr<model::HfWeights> base;
  if (!adapter && !reader.state().base.empty()) {
    ckpt::check_checkpoint_base(result.checkpoint, reader.state().base, ckpt::identify_base(recipe.model.init_from));
    base = std::make_unique<model::HfWeights>(recipe.model.init_from, recipe.model);
  }
  const std::vector<model::TensorShape> tensors =
      adapter ? std::vector<model::TensorShape>{} : model_tensors_of(recipe, reader, base.get());
  fs::create_directories(out_dir);
  const Tokens tokens = write_tokenizer(recipe, out_dir);
  o.bos_token_id = tokens.bos, o.eos_token_id = tokens.eos, o.end_of_turn_id = tokens.end_of_turn;
  // A reward model's score is read before the pad token: TRL's pad_token, else the eos (data/score_token.h).
  if (recipe.model.score_head) o.pad_token_id = tokens.pad ? tokens.pad : tokens.eos;
  result.tokenizer = tokens.tokenizer;
  if (adapter) {
    result.files = write_peft_adapter(recipe, reader, o.dtype, out_dir), result.adapter = true;
    return result;
  }
  const at::ScalarType held = model::scalar_type(recipe.precision.dtype);
  // One tensor in memory at a time: read whole from its pieces (a LoRA run's adapters merged in),
  // converted and written.
  result.files = model::export_hf_streaming(
      recipe.model, tensors,
      [&](const model::TensorShape& t) {
        const at::Tensor w = reader.find(t.name) ? read_fp32(reader, t.name) : base->read(t.name).to(held).to(at::kFloat);
        return recipe.lora.enabled() ? merged_weight(recipe, reader, t.name, w) : w;
      },
      o, out_dir);
  return result;
}

}  // namespace dstrain::tasks
