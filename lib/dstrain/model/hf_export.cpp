#include "dstrain/model/hf_export.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"

namespace dstrain::model {
namespace fs = std::filesystem;

namespace {

// Rows of a V2/V3 projection that carry RoPE dims, as (first row, count) runs of dr rows each:
// per head the last dr rows of q_proj / q_b_proj, and rows [kv_lora_rank, +dr) of
// kv_a_proj_with_mqa. Empty for other tensors.
std::vector<int64_t> rope_row_starts(const config::ModelConfig& c, const std::string& name) {
  std::vector<int64_t> starts;
  if (c.family != config::ModelFamily::kMlaMoe) return starts;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("self_attn.q_proj.weight") || ends_with("self_attn.q_b_proj.weight"))
    for (int64_t h = 0; h < c.num_heads; ++h) starts.push_back(h * (dn + dr) + dn);
  if (ends_with("self_attn.kv_a_proj_with_mqa.weight")) starts.push_back(c.kv_lora_rank);
  return starts;
}

// interleaved (x0 x1 x2 x3 ...) -> half-split (x0 x2 ... | x1 x3 ...), or back.
at::Tensor permute_rope_rows(const config::ModelConfig& c, const std::string& name, const at::Tensor& w, bool to_interleaved) {
  const auto starts = rope_row_starts(c, name);
  if (starts.empty()) return w;
  const int64_t dr = c.qk_rope_head_dim;
  std::vector<int64_t> order(static_cast<size_t>(w.size(0)));
  for (int64_t i = 0; i < w.size(0); ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t s : starts)
    for (int64_t i = 0; i < dr / 2; ++i) {
      // half-split row (s + i) is interleaved row (s + 2i); half-split (s + dr/2 + i) is (s + 2i + 1)
      if (to_interleaved)
        order[static_cast<size_t>(s + 2 * i)] = s + i, order[static_cast<size_t>(s + 2 * i + 1)] = s + dr / 2 + i;
      else
        order[static_cast<size_t>(s + i)] = s + 2 * i, order[static_cast<size_t>(s + dr / 2 + i)] = s + 2 * i + 1;
    }
  return w.index_select(0, at::tensor(order, at::kLong));
}

// rope_scaling as transformers 4 and 5 both read it (next to the top-level rope_theta).
nlohmann::json rope_scaling_json(const config::ModelConfig& c) {
  if (c.rope_scaling == config::RopeScaling::kNone) return nullptr;
  nlohmann::json s = {{"rope_type", config::name(c.rope_scaling)}, {"factor", c.rope_factor}};
  if (c.rope_scaling == config::RopeScaling::kLinear) return s;
  s["original_max_position_embeddings"] = c.rope_original_max_position > 0 ? c.rope_original_max_position : c.max_seq_len;
  s["beta_fast"] = c.rope_beta_fast, s["beta_slow"] = c.rope_beta_slow;
  if (c.rope_mscale > 0) s["mscale"] = c.rope_mscale;
  if (c.rope_mscale_all_dim > 0) s["mscale_all_dim"] = c.rope_mscale_all_dim;
  if (c.rope_attention_factor > 0) s["attention_factor"] = c.rope_attention_factor;
  return s;
}

nlohmann::json hf_config_json(const config::ModelConfig& c) {
  nlohmann::json cfg = {{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_layers},
                        {"num_attention_heads", c.num_heads},
                        {"max_position_embeddings", c.max_seq_len},
                        {"rope_theta", c.rope_theta},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"initializer_range", c.init_std},
                        {"hidden_act", "silu"},
                        {"tie_word_embeddings", false},
                        {"attention_bias", false},
                        {"rope_scaling", rope_scaling_json(c)},
                        {"torch_dtype", "float32"}};
  if (c.family == config::ModelFamily::kDense) {
    cfg["architectures"] = {"LlamaForCausalLM"};
    cfg["model_type"] = "llama";
    cfg["num_key_value_heads"] = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
    return cfg;
  }
  const bool v3 = c.topk_method == config::TopkMethod::kNoauxTc;
  cfg["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  cfg["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  cfg["num_key_value_heads"] = c.num_heads;
  cfg["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::json(c.q_lora_rank) : nlohmann::json(nullptr);
  for (const auto& [k, v] : std::vector<std::pair<const char*, int64_t>>{{"kv_lora_rank", c.kv_lora_rank},
                                                                         {"qk_nope_head_dim", c.qk_nope_head_dim},
                                                                         {"qk_rope_head_dim", c.qk_rope_head_dim},
                                                                         {"v_head_dim", c.v_head_dim},
                                                                         {"moe_intermediate_size", c.moe_intermediate_size},
                                                                         {"n_routed_experts", c.n_routed_experts},
                                                                         {"n_shared_experts", c.n_shared_experts},
                                                                         {"num_experts_per_tok", c.num_experts_per_tok},
                                                                         {"first_k_dense_replace", c.first_k_dense_replace},
                                                                         {"moe_layer_freq", c.moe_layer_freq},
                                                                         {"n_group", c.n_group},
                                                                         {"topk_group", c.topk_group}})
    cfg[k] = v;
  cfg["scoring_func"] = config::name(c.scoring_func);
  cfg["topk_method"] = config::name(c.topk_method);
  cfg["norm_topk_prob"] = c.norm_topk_prob;
  cfg["routed_scaling_factor"] = c.routed_scaling_factor;
  cfg["aux_loss_alpha"] = c.aux_loss_alpha;
  cfg["seq_aux"] = true;
  return cfg;
}

}  // namespace

namespace {

at::ScalarType scalar_type_of(const std::string& dtype) {
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "F32") return at::kFloat;
  throw Error(ErrorCode::kUsage, fmt::format("export dtype '{}' is not F32, BF16 or F16", dtype), "use --dtype fp32, bf16 or fp16");
}

const char* torch_dtype_name(const std::string& dtype) { return dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32"; }

// Tensors into shards of at most `max` bytes, in model order (a larger tensor gets its own).
std::vector<std::vector<TensorShape>> plan_shards(const std::vector<TensorShape>& tensors, uint64_t element_bytes, uint64_t max) {
  std::vector<std::vector<TensorShape>> shards(1);
  uint64_t used = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = element_bytes;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (!shards.back().empty() && used + bytes > max) shards.emplace_back(), used = 0;
    shards.back().push_back(t);
    used += bytes;
  }
  return shards;
}

// Weight files of an earlier export into the same directory that this one does not write.
void remove_stale_weights(const std::string& out_dir, const std::vector<std::string>& written) {
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.rfind("model", 0) == 0 && (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
    const bool index = name == "model.safetensors.index.json";
    if ((weights || index) && std::find(written.begin(), written.end(), name) == written.end()) fs::remove(e.path());
  }
}

}  // namespace

uint64_t parse_byte_size(const std::string& text) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3}, {"B", 1}};
  double factor = 1;
  std::string number = text;
  for (const auto& [unit, f] : kUnits)
    if (text.size() > unit.size() && text.compare(text.size() - unit.size(), unit.size(), unit) == 0) {
      number = text.substr(0, text.size() - unit.size()), factor = f;
      break;
    }
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {}
  if (used != number.size() || !(value > 0))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' is not a size", text), "write it as 5GB, 500MB or 2GiB (GB = 10^9 bytes, GiB = 2^30)");
  return static_cast<uint64_t>(value * factor);
}

std::vector<std::string> export_hf_streaming(const config::ModelConfig& c, const std::vector<TensorShape>& tensors,
                                             const TensorReader& read, const HfExportOptions& o, const std::string& out_dir) {
  const at::ScalarType type = scalar_type_of(o.dtype);
  fs::create_directories(out_dir);
  nlohmann::json cfg = hf_config_json(c);
  cfg["torch_dtype"] = torch_dtype_name(o.dtype);
  nlohmann::json generation = {{"_from_model_config", true}};
  for (const auto& [key, id] : {std::pair{"bos_token_id", o.bos_token_id}, std::pair{"eos_token_id", o.eos_token_id}})
    if (id) cfg[key] = *id, generation[key] = *id;
  if (o.end_of_turn_id && o.end_of_turn_id != o.eos_token_id)
    generation["eos_token_id"] = o.eos_token_id ? nlohmann::json{*o.eos_token_id, *o.end_of_turn_id} : nlohmann::json(*o.end_of_turn_id);
  write_file_atomic(out_dir + "/config.json", cfg.dump(2) + "\n");
  write_file_atomic(out_dir + "/generation_config.json", generation.dump(2) + "\n");

  const auto shards = plan_shards(tensors, static_cast<uint64_t>(at::elementSize(type)), o.max_shard_bytes);
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    std::vector<io::SafetensorsWriter::Entry> entries;
    for (const auto& t : shards[k]) entries.push_back({t.name, o.dtype, t.shape}), weight_map[t.name] = file;
    io::SafetensorsWriter writer(out_dir + "/" + file, entries, {{"format", "pt"}});
    std::map<std::string, const TensorShape*> by_name;
    for (const auto& t : shards[k]) by_name[t.name] = &t;
    for (const auto& e : writer.order()) {
      const at::Tensor hf = permute_rope_rows(c, e.name, read(*by_name.at(e.name)), true).to(type).contiguous();
      writer.write(e.name, hf.data_ptr(), static_cast<uint64_t>(hf.nbytes()));
      total += static_cast<uint64_t>(hf.nbytes());
    }
    writer.finish();
    files.push_back(file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
    files.push_back("model.safetensors.index.json");
  }
  remove_stale_weights(out_dir, files);
  return files;
}

void export_hf(const config::ModelConfig& c, const NamedTensors& params, const std::string& out_dir) { export_hf(c, params, {}, out_dir); }

void export_hf(const config::ModelConfig& c, const NamedTensors& params, const NamedTensors& buffers, const std::string& out_dir) {
  std::vector<TensorShape> tensors;
  std::map<std::string, at::Tensor> values;
  for (const auto* group : {&params, &buffers})
    for (const auto& p : *group) tensors.push_back({p.name, p.tensor.sizes().vec()}), values[p.name] = p.tensor;
  export_hf_streaming(
      c, tensors, [&](const TensorShape& t) { return values.at(t.name).detach().to(at::kCPU, at::kFloat); }, {}, out_dir);
}

namespace {

constexpr const char* kSizesHint =
    "the model's sizes differ from the weights': drop the sizes from the recipe (model.init_from then takes the weights' own "
    "config.json), or point model.hf_config at it";

// Which file of an HF model directory holds which tensor ("" key: one model.safetensors holds all).
std::map<std::string, std::string> weight_files(const std::string& dir) {
  std::map<std::string, std::string> where;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    try {
      const auto j = nlohmann::json::parse(read_file(index));
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) where[it.key()] = dir + "/" + it->get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: not a valid safetensors index: {}", index, e.what()), "re-download the model");
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    where[""] = dir + "/model.safetensors";
  } else {
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir),
                "point model.init_from at a Hugging Face model directory");
  }
  return where;
}

const std::string* file_of(const std::map<std::string, std::string>& where, const std::string& name) {
  auto it = where.find(name);
  if (it == where.end()) it = where.find("");
  return it == where.end() ? nullptr : &it->second;
}

}  // namespace

std::vector<std::string> hf_weight_problems(const std::string& dir, const std::vector<NamedShape>& tensors) {
  const auto where = weight_files(dir);
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open;  // headers only: the data stays mapped, unread
  std::vector<std::string> problems;
  for (const auto& t : tensors) {
    const std::string* file = file_of(where, t.name);
    if (!file) {
      if (t.required) problems.push_back(fmt::format("{}: no tensor '{}' in the weight map", dir, t.name));
      continue;
    }
    auto& reader = open[*file];
    if (!reader) reader = std::make_unique<io::SafetensorsFile>(*file);
    const io::TensorInfo* info = reader->find(t.name);
    if (!info) {
      if (t.required) problems.push_back(fmt::format("{}: no tensor '{}'", *file, t.name));
    } else if (info->shape != t.shape) {
      problems.push_back(fmt::format("{}: '{}' has shape [{}], the model needs [{}]", *file, t.name, fmt::join(info->shape, ", "),
                                     fmt::join(t.shape, ", ")));
    } else if (info->dtype != "F32" && info->dtype != "BF16" && info->dtype != "F16") {
      problems.push_back(fmt::format("{}: '{}' has dtype {}, which dstrain does not load (F32, BF16, F16)", *file, t.name, info->dtype));
    }
  }
  return problems;
}

void check_hf_weights(const std::string& dir, const std::vector<NamedShape>& tensors) {
  const auto problems = hf_weight_problems(dir, tensors);
  if (problems.empty()) return;
  const size_t shown = std::min<size_t>(problems.size(), 8);
  throw Error(ErrorCode::kCheckpoint,
              fmt::format("model.init_from: {} of the model's {} tensors do not match the weights in {}:\n  {}{}", problems.size(),
                          tensors.size(), dir, fmt::join(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(shown), "\n  "),
                          problems.size() > shown ? fmt::format("\n  ... and {} more", problems.size() - shown) : ""),
              kSizesHint);
}

void load_hf_weights(const std::string& dir, const config::ModelConfig& config, const NamedTensors& params, const NamedTensors& buffers) {
  std::vector<NamedShape> shapes;
  for (const auto& p : params) shapes.push_back({p.name, p.tensor.sizes().vec(), true});
  for (const auto& b : buffers) shapes.push_back({b.name, b.tensor.sizes().vec(), false});
  check_hf_weights(dir, shapes);  // every mismatch at once, before any copy
  const auto where = weight_files(dir);
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open;
  c10::NoGradGuard no_grad;
  auto load = [&](const NamedTensor& p) {  // checked above: present (or an optional buffer), shape and dtype
    const std::string* name = file_of(where, p.name);
    if (!name) return;
    auto& file = open[*name];
    if (!file) file = std::make_unique<io::SafetensorsFile>(*name);
    const io::TensorInfo* info = file->find(p.name);
    if (!info) return;
    static const std::map<std::string, at::ScalarType> kTypes = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
    const auto type = kTypes.find(info->dtype);
    const at::Tensor view = at::from_blob(const_cast<uint8_t*>(info->data), p.tensor.sizes(), at::TensorOptions().dtype(type->second));
    p.tensor.copy_(permute_rope_rows(config, p.name, view, false));
  };
  for (const auto& p : params) load(p);
  for (const auto& b : buffers) load(b);  // e_score_correction_bias: V3 checkpoints have it, V2 none
}

}  // namespace dstrain::model
