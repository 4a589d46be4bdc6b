#include "dstrain/model/lora.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "dstrain/core/error.h"
#include "dstrain/model/param_builder.h"

namespace dstrain::model {
namespace {

// A targeted projection's adapter: the output plus (x Aᵀ) Bᵀ x scale, in that order (PEFT's).
class LoraAdapter final : public LinearAdapter {
 public:
  LoraAdapter(at::Tensor a, at::Tensor b, double scale) : a_(std::move(a)), b_(std::move(b)), scale_(scale) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& output) const override {
    return output + at::linear(at::linear(x.to(a_.scalar_type()), a_), b_) * scale_;
  }

 private:
  at::Tensor a_, b_;  // the model's parameters themselves (ZeRO repoints their storage; the handles follow)
  double scale_;
};

std::string last_part(const std::string& module) { return module.substr(module.rfind('.') + 1); }

// A's stream: from the seed and the module's name alone (FNV-1a), so that every rank, pipeline
// stage and expert block draws the same values for the same projection.
uint64_t stream_of(uint64_t seed, const std::string& module) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : module) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return seed ^ h;
}

}  // namespace

double lora_scale(const LoraSpec& spec) {
  const double r = static_cast<double>(spec.rank);
  return spec.rslora ? spec.alpha / std::sqrt(r) : spec.alpha / r;
}

bool lora_targets(const LoraSpec& spec, const CausalLM& model, const Linear& linear) {
  const ParamPlace& place = model.parameter_places()[linear.index];
  if (place.expert >= 0 || place.group == model.final_group()) return false;  // routed experts: not yet; MTP: never
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
  if (targeted.empty())
    throw Error(ErrorCode::kConfig, fmt::format("lora.targets [{}] match no projection of this model", fmt::join(spec.targets, ", ")),
                fmt::format("the model's projections are {}, or all-linear", fmt::join(names, ", ")));
  const at::ScalarType dtype = model.parameters().front().tensor.scalar_type();
  for (Linear* l : targeted) {
    ParamBuilder builder(model, stream_of(seed, l->module), dtype, Init::kRandom);
    const ParamPlace place = model.parameter_places()[l->index];
    builder.set_group(place.group);
    const double bound = 1.0 / std::sqrt(static_cast<double>(l->in_features()));
    const at::Tensor a = builder.insert(l->index + 1, l->module + ".lora_A.weight", ParamRole::kAdapter,
                                        builder.uniform({spec.rank, l->in_features()}, -bound, bound));
    const at::Tensor b =
        builder.insert(l->index + 2, l->module + ".lora_B.weight", ParamRole::kAdapter, builder.zeros({l->out_features(), spec.rank}));
    l->adapters.push_back(std::make_shared<LoraAdapter>(a, b, lora_scale(spec)));
  }
  for (size_t i = 0; i < model.parameters().size(); ++i)
    if (model.parameter_places()[i].role != ParamRole::kAdapter) model.freeze(i);
  return targeted.size();
}

}  // namespace dstrain::model
