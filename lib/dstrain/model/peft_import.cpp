#include "dstrain/model/peft_import.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <utility>
#include <vector>

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

// A fused expert adapter's layer prefix (model.layers.3.mlp.experts) and whether the name is its A,
// for PEFT's keys under transformers 5: <prefix>.lora_A.weight, <prefix>.base_layer.lora_B.weight, ...
bool fused_expert_key(const std::string& name, std::string* prefix, bool* is_a) {
  static const std::string kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos || name.rfind("model.layers.", 0) != 0) return false;
  std::string rest = name.substr(at + kExperts.size());
  if (rest.rfind("base_layer.", 0) == 0) rest = rest.substr(std::string("base_layer.").size());
  if (rest != "lora_A.weight" && rest != "lora_B.weight") return false;
  *prefix = name.substr(0, at + kExperts.size() - 1), *is_a = rest == "lora_A.weight";
  return true;
}

// Where a tensor of the adapter comes from: a tensor of the file, or one expert's part of a fused
// one (read when its parameter is filled: a rank reads only its experts').
struct Source {
  const io::TensorInfo* info = nullptr;
  int64_t expert = -1;  // >= 0: expert `expert` of E, rank r, from a fused A or B
  int64_t experts = 0, rank = 0;
  int64_t first_row = 0, rows = 0;  // B: the rows taken (gate_up_proj's gate or up half)
  bool is_b = false;
  std::vector<int64_t> shape() const {
    if (expert < 0) return info->shape;
    return is_b ? std::vector<int64_t>{rows, rank} : std::vector<int64_t>{rank, info->shape[1]};
  }
};

// PEFT under transformers 5 holds a DeepSeek model's routed experts fused (target_parameters
// gate_up_proj [E, 2I, H] and down_proj [E, H, I]), and their adapters so: A [E * r, in] expert by
// expert, B [out, r * E] rank by rank, gate_up_proj's out the gate's I rows then the up's. Each pair
// becomes per-expert adapters under the names dstrain (and the remote-code models) use: gate_proj
// and up_proj each take the expert's A and their rows of B; which pair is which, by the shapes
// (A's input H or I). Other tensors pass as they are.
void split_fused_experts(std::map<std::string, Source>& sources, const config::ModelConfig& c, const std::string& path) {
  std::map<std::string, std::string> a_of, b_of;  // wrapper (the key less lora_X.weight) -> name
  std::map<std::string, std::string> prefix_of;
  for (const auto& [name, source] : sources) {
    std::string prefix;
    bool is_a = false;
    if (!fused_expert_key(name, &prefix, &is_a)) continue;
    const std::string wrapper = name.substr(0, name.rfind(is_a ? ".lora_A.weight" : ".lora_B.weight"));
    (is_a ? a_of : b_of)[wrapper] = name, prefix_of[wrapper] = prefix;
  }
  const int64_t E = c.n_routed_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  for (const auto& [wrapper, prefix] : prefix_of) {
    if (!a_of.count(wrapper) || !b_of.count(wrapper))
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: {} has lora_A or lora_B alone", path, kPrefix + wrapper),
                  "save the adapter again with PEFT");
    const Source a = sources.at(a_of.at(wrapper)), b = sources.at(b_of.at(wrapper));
    const std::vector<int64_t>& as = a.info->shape;
    const std::vector<int64_t>& bs = b.info->shape;
    const bool shaped = as.size() == 2 && bs.size() == 2 && E > 0 && as[0] % E == 0 && bs[1] == as[0];
    const bool gate_up = shaped && as[1] == H && bs[0] == 2 * I, down = shaped && as[1] == I && bs[0] == H;
    if (gate_up == down)
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: the routed experts' adapter {} ([{}] and [{}]) is neither gate_up_proj's nor down_proj's for {} "
                              "experts of {} x {}",
                              path, kPrefix + wrapper, fmt::join(as, ", "), fmt::join(bs, ", "), E, H, I),
                  "the adapter was made for another model");
    sources.erase(a_of.at(wrapper)), sources.erase(b_of.at(wrapper));
    const int64_t r = as[0] / E;
    for (int64_t e = 0; e < E; ++e) {
      const auto put = [&](const std::string& proj, int64_t first, int64_t rows) {
        const std::string x = fmt::format("{}.{}.{}.", prefix, e, proj);
        sources[x + "lora_A.weight"] = {a.info, e, E, r, 0, 0, false};
        sources[x + "lora_B.weight"] = {b.info, e, E, r, first, rows, true};
      };
      if (down) put("down_proj", 0, H);
      if (gate_up) put("gate_proj", 0, I), put("up_proj", I, I);
    }
  }
}

// The fused tensors last widened: a layer's two A and two B, while its experts are read in turn.
using FusedCache = std::array<std::pair<const io::TensorInfo*, at::Tensor>, 4>;

// A source's values in fp32.
at::Tensor read_source(const Source& s, FusedCache& last) {
  if (s.expert < 0) return widened(*s.info);
  at::Tensor whole;
  for (const auto& [info, t] : last)
    if (info == s.info) whole = t;
  if (!whole.defined()) {
    whole = widened(*s.info);
    std::rotate(last.begin(), last.begin() + 3, last.end());
    last[0] = {s.info, whole};
  }
  if (!s.is_b) return whole.view({s.experts, s.rank, whole.size(1)})[s.expert];
  return whole.view({whole.size(0), s.rank, s.experts}).select(2, s.expert).narrow(0, s.first_row, s.rows);
}

}  // namespace

void load_peft_adapter(CausalLM& model, const config::Recipe& recipe) {
  const std::string path = recipe.lora.init_from + "/adapter_model.safetensors";
  const io::SafetensorsFile file(path);
  const std::set<std::string> expected = expected_names(recipe);
  std::map<std::string, Source> sources;  // by dstrain's name
  for (const auto& t : file.tensors()) sources[t.name.rfind(kPrefix, 0) == 0 ? t.name.substr(kPrefix.size()) : t.name].info = &t;
  split_fused_experts(sources, recipe.model, path);
  for (const auto& [name, source] : sources) {
    if (expected.count(name)) continue;
    const bool routed = routed_expert_index_at(name) != std::string::npos;
    throw Error(ErrorCode::kCheckpoint,
                fmt::format("{}: {} is {} this run does not train", path, source.expert < 0 ? source.info->name : kPrefix + name,
                            is_adapter_name(name) ? (routed ? "a routed expert's adapter" : "an adapter") : "a module saved in full"),
                !is_adapter_name(name) ? "list the module in lora.modules_to_save"
                : routed && !recipe.lora.experts
                    ? "set lora.experts: true (and gate_proj, up_proj, down_proj or all-linear in lora.targets)"
                    : "set lora.targets to the projections the adapter's target_modules name");
  }
  c10::NoGradGuard no_grad;
  const LoraSpec spec = lora_spec_of(recipe.lora);
  FusedCache fused;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const NamedTensor& p = model.parameters()[i];
    if (!expected.count(p.name)) continue;
    const auto found = sources.find(p.name);
    if (found == sources.end())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{} lacks {}{}", path, kPrefix + p.name, lora_saves(spec, p.name) ? " (lora.modules_to_save)" : ""),
                  "the adapter must cover every projection lora.targets names, and every module of lora.modules_to_save");
    if (found->second.shape() != p.tensor.sizes().vec())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: {} has shape [{}], this run's adapter [{}]", path, kPrefix + p.name,
                              fmt::join(found->second.shape(), ", "), fmt::join(p.tensor.sizes(), ", ")),
                  "the adapter was made for another model or rank");
    std::string rows_of = p.name;  // B's rows and DoRA's magnitudes: their projection's output rows, in the released layout
    for (const char* part : {".lora_B.", ".lora_magnitude_vector"})
      if (p.name.find(part) != std::string::npos) rows_of = p.name.substr(0, p.name.find(part)) + ".weight";
    p.tensor.copy_(permute_rope_rows(recipe.model, rows_of, read_source(found->second, fused), /*to_interleaved=*/false));
  }
}

}  // namespace dstrain::model
