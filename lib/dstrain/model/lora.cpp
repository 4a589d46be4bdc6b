#include "dstrain/model/lora.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>

#include "dstrain/config/lora_pattern.h"
#include "dstrain/core/error.h"
#include "dstrain/model/moe_experts.h"
#include "dstrain/model/param_builder.h"

namespace dstrain::model {
namespace {

// A row's dropout stream: the projection's stream and the row's place (splitmix64's finalizer).
uint64_t row_stream(uint64_t stream, int64_t row) {
  uint64_t z = stream + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(row) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A targeted projection's adapter: the output plus (dropout(x) Aᵀ) Bᵀ x scale, in that order (PEFT's).
class LoraAdapter final : public LinearAdapter {
 public:
  LoraAdapter(at::Tensor a, at::Tensor b, double scale, double dropout, uint64_t stream)
      : a_(std::move(a)), b_(std::move(b)), scale_(scale), dropout_(dropout), stream_(stream) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& output) const override {
    return output + at::linear(at::linear(lora_dropout(x.to(a_.scalar_type()), dropout_, stream_), a_), b_) * scale_;
  }

 private:
  at::Tensor a_, b_;  // the model's parameters themselves (ZeRO repoints their storage; the handles follow)
  double scale_, dropout_;
  uint64_t stream_;
};

// DoRA (Liu et al. 2024) as PEFT computes it: the output plus (m / |W + s BA| - 1) · base +
// (m / |W + s BA|) · (x Aᵀ) Bᵀ · s, the row norms detached (DoRA's section 4.3). A row whose norm
// is zero divides by 1 instead (PEFT gives NaN there, peft#2049). With dropout, x is the dropped
// input in both terms, and base its product with W (PEFT's base_result recomputed).
class DoraAdapter final : public LinearAdapter {
 public:
  DoraAdapter(at::Tensor a, at::Tensor b, at::Tensor magnitude, at::Tensor weight, double scale, double dropout, uint64_t stream)
      : a_(std::move(a)), b_(std::move(b)), m_(std::move(magnitude)), w_(std::move(weight)), scale_(scale), dropout_(dropout),
        stream_(stream) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& output) const override {
    const at::Tensor whole = x.to(a_.scalar_type()), in = lora_dropout(whole, dropout_, stream_);
    const at::Tensor base = in.is_same(whole) ? output : at::linear(in, w_.to(in.scalar_type())).to(output.scalar_type());
    at::Tensor norm;
    {
      c10::NoGradGuard no_grad;
      norm = dora_row_norms(w_.to(in.scalar_type()), at::mm(b_, a_).to(in.scalar_type()), scale_);
    }
    const at::Tensor ratio = m_ / norm;
    const at::Tensor lora = at::linear(at::linear(in, a_), b_);
    return output + ((ratio - 1) * base + ratio * lora * scale_);
  }

 private:
  at::Tensor a_, b_, m_, w_;  // the model's parameters themselves (ZeRO repoints their storage; the handles follow)
  double scale_, dropout_;
  uint64_t stream_;
};

std::string last_part(const std::string& module) { return module.substr(module.rfind('.') + 1); }

// A's stream: from the seed and the module's name alone (FNV-1a), so that every rank, pipeline
// stage and expert block draws the same values for the same projection.
uint64_t stream_of(uint64_t seed, const std::string& module) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : module) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return seed ^ h;
}

// Each module to save must name one the model has (PEFT would otherwise train nothing there);
// checked on a whole model (a pipeline stage holds a part of it: the recipe's load checks).
void check_modules_to_save(const LoraSpec& spec, const CausalLM& model) {
  for (int g = 0; g < model.num_groups(); ++g)
    if (!model.holds_group(g)) return;
  for (const std::string& m : spec.modules_to_save) {
    bool found = false;
    LoraSpec only;
    only.modules_to_save = {m};
    for (const auto& p : model.parameters()) found = found || lora_saves(only, p.name);
    if (!found)
      throw Error(ErrorCode::kConfig, fmt::format("lora.modules_to_save: '{}' is no module of this model", m),
                  "name a module as Hugging Face names it: embed_tokens, lm_head, norm, or a longer path such as model.layers.0.mlp");
  }
}

// Each pattern must give some adapted projection its value (PEFT would silently ignore it);
// checked on a whole model, as the modules to save are.
// A pattern that matches a routed expert is refused wherever it is checked: PEFT under transformers
// 5 fuses the experts' adapters at the adapter's r and lora_alpha, whatever the patterns say.
void check_patterns(const LoraSpec& spec, const CausalLM& model, const std::vector<Linear*>& targeted,
                    const std::vector<std::string>& expert_modules) {
  const auto check_experts = [&](const auto& patterns, const char* key) {
    for (const auto& entry : patterns)
      for (const std::string& m : expert_modules)
        if (config::lora_pattern_matches(entry.first, m, key))
          throw Error(ErrorCode::kConfig, fmt::format("lora.{}: '{}' matches the routed expert {}", key, entry.first, m),
                      "the routed experts' adapters take lora.rank and lora.alpha (PEFT fuses them at r under transformers 5): "
                      "narrow the pattern to other projections");
  };
  check_experts(spec.rank_pattern, "rank_pattern");
  check_experts(spec.alpha_pattern, "alpha_pattern");
  for (int g = 0; g < model.num_groups(); ++g)
    if (!model.holds_group(g)) return;
  const auto check = [&](const auto& patterns, const char* key) {
    for (const auto& entry : patterns) {
      const bool used = std::any_of(targeted.begin(), targeted.end(),
                                    [&](const Linear* l) { return config::lora_pattern_matches(entry.first, l->module, key); });
      if (!used)
        throw Error(ErrorCode::kConfig, fmt::format("lora.{}: '{}' matches no adapted projection", key, entry.first),
                    fmt::format("match a module lora.targets adapts, by its whole name (e.g. {}) or its last parts (self_attn.q_proj)",
                                targeted.empty() ? std::string("model.layers.0.self_attn.q_proj") : targeted.front()->module));
    }
  };
  check(spec.rank_pattern, "rank_pattern");
  check(spec.alpha_pattern, "alpha_pattern");
}

// The routed experts' projections spec targets: gate_proj, up_proj, down_proj by name or all-linear.
std::vector<std::string> expert_targets(const LoraSpec& spec) {
  std::vector<std::string> out;
  if (!spec.experts) return out;
  for (const char* p : {"gate_proj", "up_proj", "down_proj"})
    if (std::any_of(spec.targets.begin(), spec.targets.end(), [&](const std::string& t) { return t == "all-linear" || t == p; }))
      out.emplace_back(p);
  return out;
}

// The modules of the routed experts spec adapts here (none in the final group: MTP), in order.
struct ExpertTarget {
  std::string module;   // model.layers.3.mlp.experts.5.gate_proj
  std::string pattern;  // model.layers.3.mlp.experts.{}.gate_proj: the expert's global index left open
  int group = 0;
  int64_t local = 0;
  ExpertLora* lora = nullptr;
  const at::Tensor* weight = nullptr;
};
std::vector<ExpertTarget> expert_modules(const LoraSpec& spec, CausalLM& model) {
  std::vector<ExpertTarget> out;
  const std::vector<std::string> projections = expert_targets(spec);
  if (projections.empty()) return out;
  for (const CausalLM::ExpertLayer& layer : model.expert_layers()) {
    if (layer.group == model.final_group()) continue;
    LocalExperts& x = *layer.experts;
    for (const std::string& p : projections) {
      ExpertLora* lora = p == "gate_proj" ? &x.gate_lora : p == "up_proj" ? &x.up_lora : &x.down_lora;
      const std::vector<at::Tensor>& weights = p == "gate_proj" ? x.gate : p == "up_proj" ? x.up : x.down;
      for (size_t e = 0; e < weights.size(); ++e)
        out.push_back({fmt::format("{}{}.{}", layer.prefix, x.first + static_cast<int64_t>(e), p), layer.prefix + "{}." + p, layer.group,
                       static_cast<int64_t>(e), lora, &weights[e]});
    }
  }
  return out;
}

// Adapters on the routed experts, each beside its expert's weight in the expert's block (moved
// there in one pass: a model may have tens of thousands), drawn as a Linear's are.
void attach_expert_lora(CausalLM& model, const LoraSpec& spec, uint64_t seed, const std::vector<ExpertTarget>& targets, Init init) {
  if (targets.empty()) return;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < model.parameters().size(); ++i) index[model.parameters()[i].name] = i;
  const size_t mark = model.parameters().size();
  const c10::ScalarType dtype = model.parameters().front().tensor.scalar_type();
  std::vector<size_t> anchors;
  for (const ExpertTarget& t : targets) {
    ParamBuilder builder(model, stream_of(seed, t.module), dtype, init);
    builder.set_group(t.group);
    const int64_t in = t.weight->size(1), out = t.weight->size(0);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    builder.set_expert(t.local, t.pattern + ".lora_A.weight");
    const at::Tensor a = builder.add(t.module + ".lora_A.weight", ParamRole::kAdapter, builder.uniform({spec.rank, in}, -bound, bound));
    builder.set_expert(t.local, t.pattern + ".lora_B.weight");
    const at::Tensor b = builder.add(t.module + ".lora_B.weight", ParamRole::kAdapter, builder.zeros({out, spec.rank}));
    const size_t anchor = index.at(t.module + ".weight");
    anchors.push_back(anchor), anchors.push_back(anchor);
    t.lora->a.push_back(a), t.lora->b.push_back(b), t.lora->scale = lora_scale(spec);
  }
  ParamBuilder::move_after(model, mark, anchors);
}

}  // namespace

at::Tensor lora_dropout(const at::Tensor& x, double p, uint64_t stream) {
  const TrainingRows& rows = current_training_rows();
  if (p <= 0 || !rows.active()) return x;
  if (x.numel() % rows.count != 0)
    throw Error(ErrorCode::kInternal, fmt::format("lora.dropout: an input of {} elements over {} rows", x.numel(), rows.count));
  const at::Tensor flat = x.reshape({rows.count, -1});
  const int64_t part = flat.size(1);  // a sequence-parallel share: the whole row's mask is drawn, and this part kept
  std::vector<at::Tensor> masks;
  for (int64_t i = 0; i < rows.count; ++i) {
    at::Generator g = at::globalContext().defaultGenerator(x.device()).clone();
    {
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_current_seed(row_stream(stream, rows.first + i));
    }
    const at::Tensor whole = at::empty({part * rows.shares}, flat.options().dtype(at::kFloat)).bernoulli_(1.0 - p, g);
    masks.push_back(rows.shares > 1 ? whole.narrow(0, rows.share * part, part) : whole);
  }
  // As torch's dropout: the noise in the input's dtype, divided by 1 - p, times the input.
  return (flat * at::stack(masks).to(flat.scalar_type()).div_(1.0 - p)).view(x.sizes());
}

bool is_adapter_name(const std::string& name) {
  for (const std::string part : {".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector"})
    if (name.size() > part.size() && name.compare(name.size() - part.size(), part.size(), part) == 0) return true;
  return false;
}

size_t routed_expert_index_at(const std::string& name) {
  static const std::string kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::string::npos;
  const size_t index = at + kExperts.size(), end = name.find_first_not_of("0123456789", index);
  return end != index && end != std::string::npos && name[end] == '.' ? index : std::string::npos;
}

std::string lora_a_module(const std::string& name) {
  static const std::string kA = ".lora_A.weight";
  const bool a = name.size() > kA.size() && name.compare(name.size() - kA.size(), kA.size(), kA) == 0;
  return a ? name.substr(0, name.size() - kA.size()) : std::string();
}

LoraSpec lora_spec_of(const config::LoraConfig& config) {
  LoraSpec spec;
  spec.rank = config.rank, spec.alpha = config.alpha, spec.rslora = config.use_rslora;
  spec.targets = config.targets, spec.modules_to_save = config.modules_to_save, spec.dora = config.use_dora;
  spec.rank_pattern = config.rank_pattern, spec.alpha_pattern = config.alpha_pattern, spec.dropout = config.dropout;
  spec.experts = config.experts;
  return spec;
}

ModuleLora lora_of(const LoraSpec& spec, const std::string& module) {
  ModuleLora out{spec.rank, spec.alpha};
  const auto pick = [&](const auto& patterns, auto& value, const char* key) {
    const std::string* chosen = nullptr;
    for (const auto& [pattern, v] : patterns) {
      if (!config::lora_pattern_matches(pattern, module, key)) continue;
      if (chosen && patterns.at(*chosen) != v)
        throw Error(ErrorCode::kConfig,
                    fmt::format("lora.{}: '{}' and '{}' both match {}, with {:g} and {:g}", key, *chosen, pattern, module,
                                static_cast<double>(patterns.at(*chosen)), static_cast<double>(v)),
                    "make the patterns exclusive (PEFT would take whichever its dict lists first)");
      chosen = &pattern, value = v;
    }
  };
  pick(spec.rank_pattern, out.rank, "rank_pattern");
  pick(spec.alpha_pattern, out.alpha, "alpha_pattern");
  return out;
}

bool lora_saves(const LoraSpec& spec, const std::string& name) {
  const std::string module = name.substr(0, name.rfind('.'));
  for (const std::string& m : spec.modules_to_save)
    if (module == m || (module.size() > m.size() && module.compare(module.size() - m.size() - 1, m.size() + 1, "." + m) == 0)) return true;
  return false;
}

at::Tensor dora_row_norms(const at::Tensor& weight, const at::Tensor& lora_weight, double scale) {
  const at::Tensor norm = at::linalg_vector_norm(weight + scale * lora_weight, 2, at::IntArrayRef{1}).to(weight.scalar_type());
  return at::where(norm == 0, at::ones_like(norm), norm);
}

double lora_scale(const LoraSpec& spec, const ModuleLora& module) {
  const double r = static_cast<double>(module.rank);
  return spec.rslora ? module.alpha / std::sqrt(r) : module.alpha / r;
}

double lora_scale(const LoraSpec& spec) { return lora_scale(spec, {spec.rank, spec.alpha}); }

bool lora_targets(const LoraSpec& spec, const CausalLM& model, const Linear& linear) {
  const ParamPlace& place = model.parameter_places()[linear.index];
  if (place.expert >= 0 || place.group == model.final_group()) return false;  // routed experts: no Linears; MTP: never
  const std::string name = last_part(linear.module);
  for (const std::string& t : spec.targets) {
    if (t == "all-linear" && linear.role != ParamRole::kRouter) return true;
    if (t == name) return true;
  }
  return false;
}

size_t attach_lora(CausalLM& model, const LoraSpec& spec, uint64_t seed) {
  if (spec.rank < 1)
    throw Error(ErrorCode::kConfig, fmt::format("lora.rank {}: an adapter needs a rank of at least 1", spec.rank),
                "give lora.rank, e.g. 8 or 16");
  std::vector<Linear*> targeted;
  std::set<std::string> names;
  for (Linear* l : model.linears()) {
    names.insert(last_part(l->module));
    if (lora_targets(spec, model, *l)) targeted.push_back(l);
  }
  const std::vector<ExpertTarget> experts = expert_modules(spec, model);
  if (spec.experts && model.local_experts().count == 0)
    throw Error(ErrorCode::kConfig, "lora.experts: this model has no routed experts", "leave lora.experts out, or false");
  if (spec.experts && expert_targets(spec).empty())
    throw Error(ErrorCode::kConfig,
                fmt::format("lora.experts: lora.targets [{}] name none of the routed experts' projections", fmt::join(spec.targets, ", ")),
                "add gate_proj, up_proj and down_proj (or all-linear) to lora.targets");
  if (targeted.empty() && experts.empty())
    throw Error(ErrorCode::kConfig, fmt::format("lora.targets [{}] match no projection of this model", fmt::join(spec.targets, ", ")),
                fmt::format("the model's projections are {}, or all-linear", fmt::join(names, ", ")));
  check_modules_to_save(spec, model);
  std::vector<std::string> expert_names;
  for (const ExpertTarget& t : experts) expert_names.push_back(t.module);
  check_patterns(spec, model, targeted, expert_names);
  const at::Tensor first = model.parameters().front().tensor;             // a copy: inserting moves the list
  const Init init = first.is_meta() ? Init::kShapesOnly : Init::kRandom;  // a model of shapes gets adapters of shapes
  attach_expert_lora(model, spec, seed, experts, init);
  for (Linear* l : targeted) {
    ParamBuilder builder(model, stream_of(seed, l->module), first.scalar_type(), init);
    const ParamPlace place = model.parameter_places()[l->index];
    builder.set_group(place.group);
    const double bound = 1.0 / std::sqrt(static_cast<double>(l->in_features()));
    const ModuleLora own = lora_of(spec, l->module);
    const uint64_t dropout_stream = ~stream_of(seed, l->module);  // not A's
    const at::Tensor a = builder.insert(l->index + 1, l->module + ".lora_A.weight", ParamRole::kAdapter,
                                        builder.uniform({own.rank, l->in_features()}, -bound, bound));
    const at::Tensor b =
        builder.insert(l->index + 2, l->module + ".lora_B.weight", ParamRole::kAdapter, builder.zeros({l->out_features(), own.rank}));
    if (!spec.dora) {
      l->adapters.push_back(std::make_shared<LoraAdapter>(a, b, lora_scale(spec, own), spec.dropout, dropout_stream));
      continue;
    }
    // DoRA's magnitude starts as W's row norms (B = 0), in W's dtype as PEFT's.
    const at::Tensor norms = init == Init::kShapesOnly
                                 ? builder.zeros({l->out_features()})
                                 : at::linalg_vector_norm(l->weight.detach(), 2, at::IntArrayRef{1}).to(first.scalar_type());
    const at::Tensor m = builder.insert(l->index + 3, l->module + ".lora_magnitude_vector", ParamRole::kAdapter, norms);
    l->adapters.push_back(std::make_shared<DoraAdapter>(a, b, m, l->weight, lora_scale(spec, own), spec.dropout, dropout_stream));
  }
  for (size_t i = 0; i < model.parameters().size(); ++i)
    if (model.parameter_places()[i].role != ParamRole::kAdapter && !lora_saves(spec, model.parameters()[i].name)) model.freeze(i);
  return targeted.size() + experts.size();
}

std::string describe_lora(const CausalLM& model, const LoraSpec& spec, size_t adapted) {
  int64_t adapters = 0, saved = 0, frozen = 0;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const int64_t n = model.parameters()[i].tensor.numel();
    const ParamPlace& place = model.parameter_places()[i];
    (place.role == ParamRole::kAdapter ? adapters : place.trains ? saved : frozen) += n;
  }
  const double total = static_cast<double>(adapters + saved + frozen);
  size_t own = 0, routed = 0;  // projections with a rank or alpha of their own (rank_pattern, alpha_pattern); routed experts'
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const std::string module = lora_a_module(model.parameters()[i].name);
    if (module.empty()) continue;
    if (model.parameter_places()[i].expert >= 0) {
      ++routed;
      continue;
    }
    const ModuleLora m = lora_of(spec, module);
    own += m.rank != spec.rank || m.alpha != spec.alpha;
  }
  return fmt::format(
      "lora: rank {}, alpha {:g} (scale {:g}{}{}{}) on {} projections ({}{}){}: {:.3f}M adapter parameters{} train ({:.2f}%), the "
      "base's {:.3f}M are frozen",
      spec.rank, spec.alpha, lora_scale(spec), spec.rslora ? ", rsLoRA" : "", spec.dora ? ", DoRA" : "",
      spec.dropout > 0 ? fmt::format(", dropout {:g}", spec.dropout) : "", adapted, fmt::join(spec.targets, ", "),
      routed > 0 ? fmt::format("; {} of them the routed experts' here", routed) : "",
      own > 0 ? fmt::format(", {} of them with their own rank or alpha", own) : "", static_cast<double>(adapters) / 1e6,
      saved > 0 ? fmt::format(" and {:.3f}M of [{}]", static_cast<double>(saved) / 1e6, fmt::join(spec.modules_to_save, ", ")) : "",
      100.0 * static_cast<double>(adapters + saved) / std::max(total, 1.0), static_cast<double>(frozen) / 1e6);
}

config::FrozenCounts lora_counts(const config::Recipe& recipe) {
  const auto model = make_model(recipe.model, 0, c10::ScalarType::Float, nullptr, Init::kShapesOnly);
  attach_lora(*model, lora_spec_of(recipe.lora), 0);
  config::FrozenCounts out;
  out.dense.assign(static_cast<size_t>(model->num_groups()), 0.0);
  out.routed = out.adapters = out.routed_adapters = out.dense;
  const bool quantized = recipe.lora.base != config::LoraBase::kModel;
  if (quantized) out.quantized = out.quantized_routed = out.dense;
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    const ParamPlace& place = model->parameter_places()[i];
    const double n = static_cast<double>(model->parameters()[i].tensor.numel());
    const auto group = static_cast<size_t>(place.group);
    if (place.role == ParamRole::kAdapter)
      (place.expert >= 0 ? out.routed_adapters : out.adapters)[group] += n;
    else if (!place.trains)
      (place.expert >= 0 ? out.routed : out.dense)[group] += n;
    if (quantized && !place.trains && stored_as_fp8(place.role)) (place.expert >= 0 ? out.quantized_routed : out.quantized)[group] += n;
  }
  return out;
}

bool lora_checkpoints_name_base(const config::Recipe& recipe) { return recipe.lora.enabled() && !recipe.model.init_from.empty(); }

}  // namespace dstrain::model
