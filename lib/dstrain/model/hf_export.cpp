#include "dstrain/model/hf_export.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

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
                        {"rope_scaling", nullptr},
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

void export_hf(const config::ModelConfig& c, const NamedTensors& params, const std::string& out_dir) { export_hf(c, params, {}, out_dir); }

void export_hf(const config::ModelConfig& c, const NamedTensors& params, const NamedTensors& buffers, const std::string& out_dir) {
  fs::create_directories(out_dir);
  const nlohmann::json cfg = hf_config_json(c);
  write_file_atomic(out_dir + "/config.json", cfg.dump(2) + "\n");
  std::vector<at::Tensor> keep;  // contiguous CPU float32 copies stay alive while writing
  keep.reserve(params.size() + buffers.size());
  std::vector<io::TensorToWrite> tensors;
  for (const auto* group : {&params, &buffers})
    for (const auto& p : *group) {
      keep.push_back(permute_rope_rows(c, p.name, p.tensor.detach().to(at::kCPU, at::kFloat), true).contiguous());
      tensors.push_back({p.name, "F32", keep.back().sizes().vec(), keep.back().data_ptr(), static_cast<uint64_t>(keep.back().nbytes())});
    }
  io::write_safetensors(out_dir + "/model.safetensors", std::move(tensors), {{"format", "pt"}});
}

void load_hf_weights(const std::string& dir, const config::ModelConfig& config, const NamedTensors& params, const NamedTensors& buffers) {
  // Which file holds which tensor.
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
    for (const auto* group : {&params, &buffers})
      for (const auto& p : *group) where[p.name] = dir + "/model.safetensors";
  } else {
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir),
                "point model.init_from at a Hugging Face model directory");
  }
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open;
  c10::NoGradGuard no_grad;
  auto load = [&](const NamedTensor& p, bool required) {
    const auto w = where.find(p.name);
    if (w == where.end() && !required) return;
    if (w == where.end())
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: no tensor '{}' in the weight map", dir, p.name),
                  "is this a model of the same architecture?");
    auto& file = open[w->second];
    if (!file) file = std::make_unique<io::SafetensorsFile>(w->second);
    const io::TensorInfo* info = file->find(p.name);
    if (!info && !required) return;
    if (!info)
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: no tensor '{}'", w->second, p.name),
                  "is this a model of the same architecture?");
    if (info->shape != p.tensor.sizes().vec())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: '{}' has shape [{}], the model needs [{}]", w->second, p.name, fmt::join(info->shape, ", "),
                              fmt::join(p.tensor.sizes(), ", ")),
                  "the recipe's model sizes differ from the weights' config.json; use model.hf_config to take them from it");
    static const std::map<std::string, at::ScalarType> kTypes = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
    const auto type = kTypes.find(info->dtype);
    if (type == kTypes.end())
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: '{}' has dtype {}, which dstrain does not load", w->second, p.name, info->dtype),
                  "");
    const at::Tensor view = at::from_blob(const_cast<uint8_t*>(info->data), p.tensor.sizes(), at::TensorOptions().dtype(type->second));
    p.tensor.copy_(permute_rope_rows(config, p.name, view, false));
  };
  for (const auto& p : params) load(p, true);
  for (const auto& b : buffers) load(b, false);  // e_score_correction_bias: V3 checkpoints have it, V2 none
}

}  // namespace dstrain::model
