#include "dstrain/model/freeze.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include <algorithm>

#include "dstrain/core/error.h"
#include "dstrain/model/lora.h"

namespace dstrain::model {
namespace {

bool is_role_name(const std::string& s, ParamRole* role) {
  for (ParamRole r : all_roles())
    if (s == role_name(r)) return *role = r, true;
  return false;
}

std::string roles_list() {
  std::vector<std::string> names;
  for (ParamRole r : all_roles()) names.push_back(role_name(r));
  return fmt::format("{}", fmt::join(names, ", "));
}

// A few of the model's names, to show what a glob can match.
std::string example_names(const NamedTensors& params) {
  std::vector<std::string> out;
  for (const auto& p : params)
    if (out.size() < 4 && (p.name.find("layers.0.") != std::string::npos || p.name.find("layers.") == std::string::npos))
      out.push_back(p.name);
  return fmt::format("{}", fmt::join(out, ", "));
}

}  // namespace

FrozenSet frozen_set(const config::ModelConfig& config, const std::vector<std::string>& patterns) {
  FrozenSet out;
  // The whole model's parameters under their global names, without memory.
  const auto model = make_model(config, 0, c10::ScalarType::Float, nullptr, Init::kShapesOnly);
  const NamedTensors& params = model->parameters();
  const std::vector<ParamPlace>& places = model->parameter_places();
  out.dense.assign(static_cast<size_t>(model->num_groups()), 0.0);
  out.routed.assign(out.dense.size(), 0.0);
  for (const auto& p : params) out.total += p.tensor.numel();
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& pattern = patterns[i];
    ParamRole role{};
    const bool by_role = is_role_name(pattern, &role);
    size_t matched = 0;
    for (size_t k = 0; k < params.size(); ++k)
      if (by_role ? places[k].role == role : fnmatch(pattern.c_str(), params[k].name.c_str(), 0) == 0) {
        ++matched;
        out.names.insert(params[k].name);
      }
    if (matched == 0)
      throw Error(ErrorCode::kConfig,
                  fmt::format("train.freeze[{}]: '{}' matches no parameter of this model{}; the roles are {}, and the "
                              "parameters have Hugging Face names such as {}",
                              i, pattern, by_role ? " (it has no parameters of that role)" : "", roles_list(), example_names(params)),
                  "give a role or a glob over those names (`*` crosses dots, [0-3] is a character class)");
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (!out.names.count(params[k].name)) continue;
    const double n = static_cast<double>(params[k].tensor.numel());
    out.frozen += params[k].tensor.numel();
    (places[k].expert >= 0 ? out.routed : out.dense)[static_cast<size_t>(places[k].group)] += n;
    if (places[k].role == ParamRole::kRouter) ++out.frozen_routers;
  }
  if (!params.empty() && out.names.size() == params.size())
    throw Error(ErrorCode::kConfig,
                fmt::format("train.freeze [{}] freezes every parameter of the model: nothing would train", fmt::join(patterns, ", ")),
                "leave out what should train (the list names what does not)");
  return out;
}

config::FrozenCounts frozen_counts_of(const config::Recipe& recipe) {
  if (recipe.lora.enabled()) return lora_counts(recipe);
  const FrozenSet set = frozen_set(recipe.model, recipe.train.freeze);
  config::FrozenCounts out;
  out.dense = set.dense, out.routed = set.routed;
  return out;
}

void apply_frozen_set(CausalLM& model, const FrozenSet& set) {
  const NamedTensors& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (set.names.count(params[i].name)) model.freeze(i);
}

std::string describe_frozen(const config::ModelConfig& config, const FrozenSet& set) {
  const bool moves_bias = config.topk_method == config::TopkMethod::kNoauxTc && config.bias_update_speed > 0;
  return fmt::format(
      "train.freeze: {} of {} parameters frozen ({:.1f}%, {} tensors), {} train{}", set.frozen, set.total,
      100.0 * static_cast<double>(set.frozen) / static_cast<double>(std::max<int64_t>(set.total, 1)), set.names.size(), set.trainable(),
      set.frozen_routers > 0 && moves_bias
          ? fmt::format("; {} frozen router(s): their selection bias (e_score_correction_bias) is not updated either", set.frozen_routers)
          : "");
}

}  // namespace dstrain::model
