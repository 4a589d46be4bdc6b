#include "dstrain/model/peft_import.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/lora.h"

namespace dstrain::model {
namespace {

const std::string kPrefix = "base_model.model.";

// V3's MTP modules are decoder layers numbered from num_layers on.
bool is_mtp(const config::ModelConfig& config, const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (name.rfind(kLayers, 0) != 0) return false;
  return std::stoll(name.substr(kLayers.size(), name.find('.', kLayers.size()) - kLayers.size())) >= config.num_layers;
}

// What the adapter must hold for this recipe: every adapter and saved module of the whole model
// (every stage, every expert), but the MTP modules' (PEFT's transformers model has none).
std::set<std::string> expected_names(const config::Recipe& recipe) {
  const auto whole = make_model(recipe.model, 0, c10::ScalarType::Float, nullptr, Init::kShapesOnly);
  const LoraSpec spec = lora_spec_of(recipe.lora);
  attach_lora(*whole, spec, 0);
  std::set<std::string> names;
  for (size_t i = 0; i < whole->parameters().size(); ++i) {
    const std::string& name = whole->parameters()[i].name;
    const bool wanted = whole->parameter_places()[i].role == ParamRole::kAdapter || lora_saves(spec, name);
    if (wanted && !is_mtp(recipe.model, name)) names.insert(name);
  }
  return names;
}

at::Tensor widened(const io::TensorInfo& t) {
  static const std::map<std::string, at::ScalarType> kTypes = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
  const auto type = kTypes.find(t.dtype);
  if (type == kTypes.end())
    throw Error(ErrorCode::kCheckpoint, fmt::format("adapter tensor {} is {}: F32, BF16 or F16 can be read", t.name, t.dtype),
                "save the adapter in one of those dtypes");
  return at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::TensorOptions().dtype(type->second)).to(at::kFloat);
}

}  // namespace

void load_peft_adapter(CausalLM& model, const config::Recipe& recipe) {
  const std::string path = recipe.lora.init_from + "/adapter_model.safetensors";
  const io::SafetensorsFile file(path);
  const std::set<std::string> expected = expected_names(recipe);
  for (const auto& t : file.tensors()) {
    const std::string name = t.name.rfind(kPrefix, 0) == 0 ? t.name.substr(kPrefix.size()) : t.name;
    if (!expected.count(name))
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: {} is {} this run does not train", path, t.name,
                              is_adapter_name(name) ? "an adapter" : "a module saved in full"),
                  is_adapter_name(name) ? "set lora.targets to the projections the adapter's target_modules name"
                                        : "list the module in lora.modules_to_save");
  }
  c10::NoGradGuard no_grad;
  const LoraSpec spec = lora_spec_of(recipe.lora);
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const NamedTensor& p = model.parameters()[i];
    if (!expected.count(p.name)) continue;
    const io::TensorInfo* t = file.find(kPrefix + p.name);
    if (!t)
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{} lacks {}{}", path, kPrefix + p.name, lora_saves(spec, p.name) ? " (lora.modules_to_save)" : ""),
                  "the adapter must cover every projection lora.targets names, and every module of lora.modules_to_save");
    if (t->shape != p.tensor.sizes().vec())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: {} has shape [{}], this run's adapter [{}]", path, t->name, fmt::join(t->shape, ", "),
                              fmt::join(p.tensor.sizes(), ", ")),
                  "the adapter was made for another model or rank");
    std::string rows_of = p.name;  // B's rows and DoRA's magnitudes: their projection's output rows, in the released layout
    for (const char* part : {".lora_B.", ".lora_magnitude_vector"})
      if (p.name.find(part) != std::string::npos) rows_of = p.name.substr(0, p.name.find(part)) + ".weight";
    p.tensor.copy_(permute_rope_rows(recipe.model, rows_of, widened(*t), /*to_interleaved=*/false));
  }
}

}  // namespace dstrain::model
