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

void export_hf(const config::ModelConfig& c, const NamedTensors& params, const std::string& out_dir) {
  if (c.family != "dense")
    throw Error(ErrorCode::kUsage, "Hugging Face export of the mla_moe family is not implemented yet",
                "V2/V3 checkpoints store RoPE dims interleaved; the export that converts them comes with the rest of the model issue");
  fs::create_directories(out_dir);
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_layers},
                        {"num_attention_heads", c.num_heads},
                        {"num_key_value_heads", c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads},
                        {"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.max_seq_len},
                        {"rope_theta", c.rope_theta},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"initializer_range", c.init_std},
                        {"hidden_act", "silu"},
                        {"tie_word_embeddings", false},
                        {"attention_bias", false},
                        {"torch_dtype", "float32"}};
  write_file_atomic(out_dir + "/config.json", cfg.dump(2) + "\n");
  std::vector<at::Tensor> keep;  // contiguous CPU float32 copies stay alive while writing
  std::vector<io::TensorToWrite> tensors;
  for (const auto& p : params) {
    keep.push_back(p.tensor.detach().to(at::kCPU, at::kFloat).contiguous());
    tensors.push_back({p.name, "F32", keep.back().sizes().vec(), keep.back().data_ptr(), static_cast<uint64_t>(keep.back().nbytes())});
  }
  io::write_safetensors(out_dir + "/model.safetensors", std::move(tensors), {{"format", "pt"}});
}

void load_hf_weights(const std::string& dir, const NamedTensors& params) {
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
    for (const auto& p : params) where[p.name] = dir + "/model.safetensors";
  } else {
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir),
                "point model.init_from at a Hugging Face model directory");
  }
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open;
  c10::NoGradGuard no_grad;
  for (const auto& p : params) {
    const auto w = where.find(p.name);
    if (w == where.end()) throw Error(ErrorCode::kCheckpoint, fmt::format("{}: no tensor '{}' in the weight map", dir, p.name), "is this a model of the same architecture?");
    auto& file = open[w->second];
    if (!file) file = std::make_unique<io::SafetensorsFile>(w->second);
    const io::TensorInfo* info = file->find(p.name);
    if (!info) throw Error(ErrorCode::kCheckpoint, fmt::format("{}: no tensor '{}'", w->second, p.name), "is this a model of the same architecture?");
    if (info->shape != p.tensor.sizes().vec())
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: '{}' has shape [{}], the model needs [{}]", w->second, p.name, fmt::join(info->shape, ", "),
                                                      fmt::join(p.tensor.sizes(), ", ")),
                  "the recipe's model sizes differ from the weights' config.json; use model.hf_config to take them from it");
    static const std::map<std::string, at::ScalarType> kTypes = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
    const auto type = kTypes.find(info->dtype);
    if (type == kTypes.end()) throw Error(ErrorCode::kCheckpoint, fmt::format("{}: '{}' has dtype {}, which dstrain does not load", w->second, p.name, info->dtype), "");
    const at::Tensor view = at::from_blob(const_cast<uint8_t*>(info->data), p.tensor.sizes(), at::TensorOptions().dtype(type->second));
    p.tensor.copy_(view);
  }
}

}  // namespace dstrain::model
