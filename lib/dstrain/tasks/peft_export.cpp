#include "dstrain/tasks/peft_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/lora.h"

namespace dstrain::tasks {
namespace {

const std::string kA = ".lora_A.weight", kB = ".lora_B.weight", kMagnitude = ".lora_magnitude_vector", kPeftPrefix = "base_model.model.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The projection an adapter tensor belongs to (its A, B or DoRA magnitude).
std::string module_of(const std::string& adapter_tensor) {
  for (const std::string& part : {kA, kB, kMagnitude})
    if (ends_with(adapter_tensor, part)) return adapter_tensor.substr(0, adapter_tensor.size() - part.size());
  return adapter_tensor;
}

// A routed expert's module (mlp.experts.5.gate_proj) with its index replaced by a mark that
// peft_target_regex turns into "any index or none".
const std::string kExpertMark = "@E";
std::string expert_free(const std::string& module) {
  const size_t index = model::routed_expert_index_at("." + module);  // a name relative to its layer starts with mlp.
  if (index == std::string::npos) return module;
  const size_t digits = index - 1, end = module.find('.', digits);         // in `module`: the index, and the dot after it
  return module.substr(0, digits - 1) + kExpertMark + module.substr(end);  // ".5" replaced
}

std::string regex_escape(const std::string& s) {
  std::string out;
  for (const char c : s) out += (c == '.' ? std::string("\\.") : std::string(1, c));
  return out;
}

// Decoder layer index of "model.layers.N.*"; -1 for other names.
int64_t layer_of(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (name.rfind(kLayers, 0) != 0) return -1;
  return std::stoll(name.substr(kLayers.size(), name.find('.', kLayers.size()) - kLayers.size()));
}

// The tensors the adapter holds, under dstrain's names: every adapter's A and B, and the
// parameters of the modules saved in full; never the MTP modules' (transformers does not load them).
std::vector<std::string> adapter_contents(const config::Recipe& recipe, const ckpt::Reader& reader) {
  const model::LoraSpec spec = model::lora_spec_of(recipe.lora);
  std::vector<std::string> names;
  for (const auto& t : reader.tensors()) {
    if (t.name.find('.') == std::string::npos || t.name.rfind("exp_avg", 0) == 0) continue;
    if (layer_of(t.name) >= recipe.model.num_layers) continue;
    if (is_adapter_tensor(t.name) || model::lora_saves(spec, t.name)) names.push_back(t.name);
  }
  return names;
}

nlohmann::json adapter_config(const config::Recipe& recipe, const std::vector<std::string>& adapters) {
  const config::LoraConfig& l = recipe.lora;
  return {{"peft_type", "LORA"},
          {"task_type", recipe.model.score_head ? "SEQ_CLS" : "CAUSAL_LM"},  // a reward model: AutoPeftModelForSequenceClassification
          {"base_model_name_or_path", recipe.model.init_from},
          {"r", l.rank},
          {"lora_alpha", l.alpha == std::floor(l.alpha) ? nlohmann::json(static_cast<int64_t>(l.alpha)) : nlohmann::json(l.alpha)},
          {"lora_dropout", l.dropout},
          {"target_modules", peft_target_regex(adapters)},
          {"use_rslora", l.use_rslora},
          {"use_dora", l.use_dora},
          {"modules_to_save", l.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(l.modules_to_save)},
          {"rank_pattern", nlohmann::json(l.rank_pattern)},
          {"alpha_pattern", nlohmann::json(l.alpha_pattern)},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"revision", nullptr}};
}

// PEFT (0.21) under transformers 5 rewrites the targets of a DeepSeek-V2/V3 model before it
// loads an adapter: gate_proj, up_proj and down_proj become the routed experts' fused parameters
// (gate_up_proj at rank 2r and alpha 2·alpha, down_proj), their per-expert adapters fused to
// match. So the dense layers' and shared experts' MLP adapters of such an export are not loaded
// there, rsLoRA's gate and up are scaled by √2 more than trained, and gate_proj without up_proj
// (or the reverse) cannot be fused. transformers' remote-code models load the export as written.
void warn_moe_mlp_targets(const config::Recipe& recipe, const std::vector<std::string>& names) {
  if (recipe.model.family != config::ModelFamily::kMlaMoe) return;
  bool dense_mlp = false, routed = false;
  std::set<std::string> routed_projections;
  for (const std::string& n : names)
    for (const std::string mlp : {"gate_proj", "up_proj", "down_proj"})
      if (ends_with(n, "." + mlp + kA)) {
        const bool expert = model::routed_expert_index_at(n) != std::string::npos;
        dense_mlp = dense_mlp || !expert, routed = routed || expert;
        if (expert) routed_projections.insert(mlp);
      }
  const std::string remedy = "transformers' remote-code DeepSeek models (trust_remote_code) load it as written; or export with --merge";
  if (dense_mlp)
    log::warn(fmt::format(
        "this adapter holds MLP projections (gate_proj, up_proj, down_proj) of a DeepSeek MoE model's dense layers or shared experts: "
        "PEFT 0.21 under transformers 5 reads those targets as the routed experts only and does not load these adapters (attention "
        "and routed-expert adapters load); {}",
        remedy));
  if (routed && recipe.lora.use_rslora)
    log::warn(fmt::format(
        "rsLoRA on the routed experts: PEFT 0.21 under transformers 5 fuses their gate_proj and up_proj adapters at rank 2r and "
        "alpha 2·alpha, which scales them by √2 more than trained (alpha / √r); {}",
        remedy));
  if (routed && routed_projections.count("gate_proj") != routed_projections.count("up_proj"))
    log::warn(fmt::format(
        "the routed experts have adapters on one of gate_proj and up_proj: PEFT 0.21 under transformers 5 fuses the two and refuses "
        "to load one without the other; {}",
        remedy));
}

}  // namespace

at::Tensor read_fp32(const ckpt::Reader& reader, const std::string& name) {
  const ckpt::TensorMeta* m = reader.find(name);
  if (!m) throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {} lacks {}", reader.dir(), name), "export a checkpoint of this run");
  at::Tensor value = at::empty(m->shape, at::kFloat);
  reader.read(name, 0, value.numel(), value.data_ptr(), "float32");
  return value;
}

bool is_adapter_tensor(const std::string& name) { return model::is_adapter_name(name); }

std::string peft_target_regex(const std::vector<std::string>& adapter_tensors) {
  std::set<int64_t> layers;
  std::set<std::string> suffixes, others;
  for (const std::string& t : adapter_tensors) {
    if (!ends_with(t, kA)) continue;
    const std::string module = module_of(t);
    const int64_t layer = layer_of(module);
    if (layer < 0) {
      others.insert(regex_escape(module));
      continue;
    }
    layers.insert(layer);
    suffixes.insert(regex_escape(expert_free(module.substr(module.find('.', std::string("model.layers.").size()) + 1))));
  }
  std::vector<std::string> alternatives(others.begin(), others.end());
  if (!layers.empty())
    alternatives.push_back(fmt::format("model\\.layers\\.({})\\.({})", fmt::join(layers, "|"), fmt::join(suffixes, "|")));
  std::string out = alternatives.size() == 1 ? alternatives.front() : fmt::format("({})", fmt::join(alternatives, "|"));
  // Every routed expert's: the index is any (PEFT under transformers 5 probes mlp.experts.gate_proj).
  for (size_t at = out.find(kExpertMark); at != std::string::npos; at = out.find(kExpertMark, at + 1))
    out.replace(at, kExpertMark.size(), "(\\.[0-9]+)?");
  return out;
}

std::vector<std::string> write_peft_adapter(const config::Recipe& recipe, const ckpt::Reader& reader, const std::string& dtype,
                                            const std::string& out_dir) {
  if (recipe.model.init_from.empty())
    throw Error(ErrorCode::kUsage,
                "this LoRA run's base is its own random initialisation, not a Hugging Face model (no model.init_from): a PEFT adapter "
                "would have no base to load on",
                "export the merged model with --merge");
  static const std::map<std::string, at::ScalarType> kTypes = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
  if (!kTypes.count(dtype))
    throw Error(ErrorCode::kUsage, fmt::format("a LoRA adapter is written in fp32, bf16 or fp16, not {}", dtype),
                "pick --dtype fp32, bf16 or fp16, or export the merged model (--merge)");
  const std::vector<std::string> names = adapter_contents(recipe, reader);
  warn_moe_mlp_targets(recipe, names);
  std::vector<io::SafetensorsWriter::Entry> entries;
  for (const std::string& n : names) entries.push_back({kPeftPrefix + n, dtype, reader.find(n)->shape});
  const std::string weights = out_dir + "/adapter_model.safetensors";
  io::SafetensorsWriter writer(weights, entries, {{"format", "pt"}});
  for (const auto& e : writer.order()) {
    const std::string name = e.name.substr(kPeftPrefix.size());
    // B's rows and DoRA's magnitudes are their projection's output rows: in the released layout as the weight's are.
    const std::string rows_of = is_adapter_tensor(name) && !ends_with(name, kA) ? module_of(name) + ".weight" : name;
    const at::Tensor stored =
        model::permute_rope_rows(recipe.model, rows_of, read_fp32(reader, name), true).to(kTypes.at(dtype)).contiguous();
    writer.write(e.name, stored.data_ptr(), static_cast<uint64_t>(stored.nbytes()));
  }
  writer.finish();
  const std::string config_path = out_dir + "/adapter_config.json";
  write_file_atomic(config_path, adapter_config(recipe, names).dump(2) + "\n");
  return {config_path, weights};
}

at::Tensor merged_weight(const config::Recipe& recipe, const ckpt::Reader& reader, const std::string& name, const at::Tensor& weight) {
  const at::Tensor& w = weight;
  const std::string module = name.size() > 7 ? name.substr(0, name.size() - 7) : name;  // less ".weight"
  if (!ends_with(name, ".weight") || !reader.find(module + kA)) return w;
  const at::Tensor a = read_fp32(reader, module + kA).to(at::kDouble), b = read_fp32(reader, module + kB).to(at::kDouble);
  const model::LoraSpec spec = model::lora_spec_of(recipe.lora);
  const at::Tensor merged = w.to(at::kDouble) + at::mm(b, a) * model::lora_scale(spec, model::lora_of(spec, module));
  if (!reader.find(module + kMagnitude)) return merged.to(at::kFloat);
  // DoRA, merged as PEFT merges it: each row scaled by m / |W + s BA|.
  const at::Tensor m = read_fp32(reader, module + kMagnitude).to(at::kDouble);
  return (merged * (m / model::dora_row_norms(merged, at::zeros_like(merged), 0.0)).unsqueeze(1)).to(at::kFloat);
}

}  // namespace dstrain::tasks
