#include "dstrain/model/hf_export.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <memory>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/causal_lm.h"

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

}  // namespace

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

namespace {

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

nlohmann::json family_config_json(const config::ModelConfig& c);

// A reward model (model.score_head) is the family's sequence classifier with one label, which
// AutoModelForSequenceClassification loads with its score.weight.
nlohmann::json hf_config_json(const config::ModelConfig& c) {
  nlohmann::json cfg = family_config_json(c);
  if (!c.score_head) return cfg;
  std::string architecture = cfg["architectures"][0].get<std::string>();
  architecture.replace(architecture.find("ForCausalLM"), 11, "ForSequenceClassification");
  cfg["architectures"] = {architecture};
  cfg["id2label"] = {{"0", "LABEL_0"}};  // num_labels 1, as transformers saves it
  cfg["label2id"] = {{"LABEL_0", 0}};
  return cfg;
}

nlohmann::json family_config_json(const config::ModelConfig& c) {
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
  if (v3) cfg["num_nextn_predict_layers"] = c.mtp_depth;  // multi-token prediction's modules (transformers ignores them)
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
  if (dtype == "F8_E4M3") return at::kFloat8_e4m3fn;
  if (dtype == "F8_E5M2") return at::kFloat8_e5m2;
  throw Error(ErrorCode::kUsage, fmt::format("export dtype '{}' is not F32, BF16, F16 or F8_E4M3", dtype),
              "use --dtype fp32, bf16, fp16 or fp8");
}

bool is_fp8(const std::string& dtype) { return dtype.rfind("F8_", 0) == 0; }

// An FP8 export's other tensors are bfloat16, as DeepSeek's release keeps them.
const char* torch_dtype_name(const std::string& dtype) {
  return dtype == "BF16" || is_fp8(dtype) ? "bfloat16" : dtype == "F16" ? "float16" : "float32";
}

// What one model tensor becomes in the files: itself in the export's dtype, or in an FP8 export
// an FP8 weight and its block scales (F32), or a tensor DeepSeek keeps wider (BF16, the router's
// selection bias F32).
struct Stored {
  const TensorShape* tensor;
  std::vector<io::SafetensorsWriter::Entry> entries;
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& e : entries) n += e.nbytes();
    return n;
  }
};

// The weights an FP8 export writes in FP8: those whose declared role DeepSeek's release stores so.
using Fp8Names = std::set<std::string>;
Fp8Names fp8_weight_names(const config::ModelConfig& c, const HfExportOptions& o) {
  Fp8Names out;
  if (!is_fp8(o.dtype)) return out;
  for (const NamedShape& s : model_tensor_shapes(c))
    if (s.shape.size() == 2 && stored_as_fp8(s.role)) out.insert(s.name);
  return out;
}

Stored stored_form(const TensorShape& t, const HfExportOptions& o, const Fp8Names& fp8) {
  if (!is_fp8(o.dtype)) return {&t, {{t.name, o.dtype, t.shape}}};
  if (fp8.count(t.name)) return {&t, {{t.name, o.dtype, t.shape}, {scale_name_of(t.name), "F32", scale_grid(t.shape, o.fp8)}}};
  const bool bias = t.name.size() > 23 && t.name.compare(t.name.size() - 23, 23, "e_score_correction_bias") == 0;
  return {&t, {{t.name, bias ? "F32" : "BF16", t.shape}}};
}

// Tensors into shards of at most `max` bytes, in model order (a larger tensor gets its own; a
// weight and its scales share one).
std::vector<std::vector<Stored>> plan_shards(const std::vector<TensorShape>& tensors, const HfExportOptions& o, const Fp8Names& fp8) {
  std::vector<std::vector<Stored>> shards(1);
  uint64_t used = 0;
  for (const auto& t : tensors) {
    Stored s = stored_form(t, o, fp8);
    if (!shards.back().empty() && used + s.bytes() > o.max_shard_bytes) shards.emplace_back(), used = 0;
    used += s.bytes();
    shards.back().push_back(std::move(s));
  }
  return shards;
}

// config.json and generation_config.json: the model, the dtype, the special ids, and for an FP8
// export its quantization_config.
void write_configs(const config::ModelConfig& c, const HfExportOptions& o, const std::string& out_dir) {
  nlohmann::json cfg = hf_config_json(c);
  cfg["torch_dtype"] = torch_dtype_name(o.dtype);
  if (is_fp8(o.dtype)) cfg["quantization_config"] = nlohmann::json::parse(fp8_format_json(o.fp8));
  nlohmann::json generation = {{"_from_model_config", true}};
  for (const auto& [key, id] : {std::pair{"bos_token_id", o.bos_token_id}, std::pair{"eos_token_id", o.eos_token_id}})
    if (id) cfg[key] = *id, generation[key] = *id;
  if (o.pad_token_id) cfg["pad_token_id"] = *o.pad_token_id;  // where a sequence classifier reads its score
  if (o.end_of_turn_id && o.end_of_turn_id != o.eos_token_id)
    generation["eos_token_id"] = o.eos_token_id ? nlohmann::json{*o.eos_token_id, *o.end_of_turn_id} : nlohmann::json(*o.end_of_turn_id);
  write_file_atomic(out_dir + "/config.json", cfg.dump(2) + "\n");
  write_file_atomic(out_dir + "/generation_config.json", generation.dump(2) + "\n");
}

// Writes one shard, a tensor at a time in the writer's order. An FP8 weight is read and
// quantized twice (for its scales, which come first, and for itself) rather than held.
uint64_t write_shard(const config::ModelConfig& c, const std::vector<Stored>& shard, const TensorReader& read, const HfExportOptions& o,
                     const Fp8Names& fp8, const std::string& path) {
  std::vector<io::SafetensorsWriter::Entry> entries;
  std::map<std::string, const TensorShape*> source;
  for (const auto& s : shard)
    for (const auto& e : s.entries) entries.push_back(e), source[e.name] = s.tensor;
  io::SafetensorsWriter writer(path, entries, {{"format", "pt"}});
  uint64_t total = 0;
  for (const auto& e : writer.order()) {
    const TensorShape& t = *source.at(e.name);
    const at::Tensor hf = permute_rope_rows(c, t.name, read(t), true);
    at::Tensor stored;
    if (fp8.count(t.name)) {
      const Fp8Weight q = quantize_fp8(hf, o.fp8);
      stored = e.name == t.name ? q.weight : q.scale_inv;
    } else {
      stored = hf.to(scalar_type_of(e.dtype));
    }
    stored = stored.contiguous();
    writer.write(e.name, stored.data_ptr(), static_cast<uint64_t>(stored.nbytes()));
    total += static_cast<uint64_t>(stored.nbytes());
  }
  writer.finish();
  return total;
}

}  // namespace

namespace {

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
  scalar_type_of(o.dtype);  // refused before anything is written
  if (is_fp8(o.dtype) && o.dtype != (o.fp8.fmt == "e5m2" ? "F8_E5M2" : "F8_E4M3"))
    throw Error(ErrorCode::kInternal, fmt::format("export dtype {} with FP8 format {}", o.dtype, o.fp8.fmt), "");
  fs::create_directories(out_dir);
  // Multi-token prediction: its modules in the released layout, each with copies of the shared
  // embedding and head; or, without it (o.mtp false), the main model alone.
  config::ModelConfig model = c;
  model.mtp_depth = 0;  // the modules written (a Hugging Face source may lack those its config names)
  std::vector<TensorShape> all;
  std::map<std::string, std::string> copy_of;
  std::map<std::string, const TensorShape*> by_name;
  for (const auto& t : tensors) {
    const int64_t depth = mtp_depth_of(c, t.name);
    if (depth > 0 && !o.mtp) continue;
    all.push_back(t), by_name[t.name] = &t, model.mtp_depth = std::max(model.mtp_depth, depth);
  }
  for (int64_t k = 1; k <= model.mtp_depth; ++k)
    for (const auto& [copy, main] : {std::pair<std::string, std::string>{"embed_tokens.weight", "model.embed_tokens.weight"},
                                     {"shared_head.head.weight", "lm_head.weight"}})
      if (by_name.count(main)) {
        const std::string name = fmt::format("model.layers.{}.{}", c.num_layers + k - 1, copy);
        all.push_back({name, by_name.at(main)->shape}), copy_of[name] = main;
      }
  const TensorReader read_any = [&](const TensorShape& t) {
    const auto it = copy_of.find(t.name);
    return read(it == copy_of.end() ? t : TensorShape{it->second, t.shape});
  };
  write_configs(model, o, out_dir);
  const Fp8Names fp8 = fp8_weight_names(c, o);
  const auto shards = plan_shards(all, o, fp8);
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    for (const auto& s : shards[k])
      for (const auto& e : s.entries) weight_map[e.name] = file;
    total += write_shard(c, shards[k], read_any, o, fp8, out_dir + "/" + file);
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

}  // namespace dstrain::model
