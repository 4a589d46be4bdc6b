#include "dstrain/model/causal_lm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdlib>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/model/dense_model.h"
#include "dstrain/model/mla_moe_model.h"

namespace dstrain::model {

namespace {

// The rows a forward computes, and under sequence parallelism which part of each it holds.
TrainingRows training_rows(const CausalLM::Input& input, int64_t rows) {
  TrainingRows r{input.first_row, rows};
  if (input.sequence) r.share = input.sequence->rank(), r.shares = input.sequence->world_size();
  return r;
}

}  // namespace

CausalLM::Hidden CausalLM::hidden_states(const Input& input, bool with_aux) const {
  Input in = input;
  if (!in.sequence) in.sequence = sequence_;
  const TrainingRowsScope rows(training_rows(in, input.tokens.size(0)));
  Hidden h;
  const Trunk t = trunk(0, final_group_, {}, in, with_aux ? &h.aux : nullptr);
  h.hidden = t.hidden, h.head = t.head, h.final_group = t.final_group, h.mtp = t.mtp;
  return h;
}

CausalLM::Hidden CausalLM::run_groups(int first, int last, const at::Tensor& x, const Input& input, bool with_aux) const {
  if (first < 0 || last > final_group_ || first > last || (first > 0) != x.defined())
    throw Error(ErrorCode::kInternal, fmt::format("a stage forward of groups [{}, {}] of 0..{} {} an input", first, last, final_group_,
                                                  x.defined() ? "with" : "without"));
  Input in = input;
  if (!in.sequence) in.sequence = sequence_;
  const TrainingRowsScope rows(training_rows(in, input.tokens.defined() ? input.tokens.size(0) : x.size(0)));
  Hidden h;
  const Trunk t = trunk(first, last, x, in, with_aux ? &h.aux : nullptr);
  h.hidden = t.hidden, h.head = t.head, h.final_group = t.final_group, h.mtp = t.mtp, h.embedded = t.embedded;
  return h;
}

bool CausalLM::holds_group(int group) const {
  if (held_.empty()) return true;
  for (const GroupRange& r : held_)
    if (group >= r.first && group <= r.last) return true;
  return false;
}

void CausalLM::check_held(int group) const {
  if (!holds_group(group))
    throw Error(ErrorCode::kInternal,
                fmt::format("a forward through layer group {}, which this pipeline stage's model does not hold", group),
                "this is a dstrain bug; please report it");
}

at::Tensor CausalLM::logits(const Input& input) const {
  const Hidden h = hidden_states(input, /*with_aux=*/false);
  return close(h, at::linear(h.hidden, h.head));
}

std::string CausalLM::expert_parameter_name(size_t index, int64_t expert) const {
  const std::string& pattern = expert_names_.at(index);
  return pattern.empty() ? params_.at(index).name : fmt::format(fmt::runtime(pattern), expert);
}

void CausalLM::freeze(size_t index) {
  places_.at(index).trains = false;
  params_.at(index).tensor.requires_grad_(false);
}

std::vector<Linear*> CausalLM::linears() {
  std::vector<Linear*> out;
  for (Linear& l : linears_) out.push_back(&l);
  return out;
}

Linear* CausalLM::linear(const std::string& module) {
  for (Linear& l : linears_)
    if (l.module == module) return &l;
  return nullptr;
}

const NamedTensors& CausalLM::buffers() const {
  static const NamedTensors none;
  return none;
}

int64_t CausalLM::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.tensor.numel();
  return n;
}

c10::ScalarType scalar_type(config::Dtype dtype) {
  switch (dtype) {
    case config::Dtype::kBf16:
      return c10::ScalarType::BFloat16;
    case config::Dtype::kFp16:
      return c10::ScalarType::Half;
    case config::Dtype::kFp32:
      break;
  }
  return c10::ScalarType::Float;
}

std::unique_ptr<CausalLM> make_model(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype,
                                     comm::Communicator* expert_group, Init init, const HeldGroups& held) {
  if (config.family == config::ModelFamily::kMlaMoe) return std::make_unique<MlaMoeModel>(config, seed, dtype, expert_group, init, held);
  if (expert_group && expert_group->world_size() > 1)
    throw Error(ErrorCode::kConfig, "expert parallelism needs an MoE model: this one is dense", "set moe.expert_parallel_size: 1");
  return std::make_unique<DenseModel>(config, seed, dtype, init, held);
}

std::vector<NamedShape> model_tensor_shapes(const config::ModelConfig& config) {
  const auto model = make_model(config, 0, c10::ScalarType::Float, nullptr, Init::kShapesOnly);
  std::vector<NamedShape> out;
  for (const auto* group : {&model->parameters(), &model->buffers()})
    for (size_t i = 0; i < group->size(); ++i) {
      const NamedTensor& p = (*group)[i];
      const bool parameter = group == &model->parameters();
      const int64_t depth = mtp_depth_of(config, p.name);
      out.push_back({p.name, p.tensor.sizes().vec(), parameter && depth == 0 && !starts_fresh_in_folder(config, p.name), depth,
                     parameter ? model->parameter_places()[i].role : ParamRole::kBias, !parameter});
    }
  return out;
}

bool starts_fresh_in_folder(const config::ModelConfig& config, const std::string& name) {
  return config.score_head && name == "score.weight";
}

int64_t mtp_depth_of(const config::ModelConfig& config, const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (config.mtp_depth == 0 || name.rfind(prefix, 0) != 0) return 0;
  const int64_t layer = std::atoll(name.c_str() + prefix.size());
  return layer >= config.num_layers ? layer - config.num_layers + 1 : 0;
}

}  // namespace dstrain::model
