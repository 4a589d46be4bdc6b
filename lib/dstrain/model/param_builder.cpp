#include "dstrain/model/param_builder.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "dstrain/core/error.h"
#include "dstrain/model/layers.h"

namespace dstrain::model {

ParamBuilder::ParamBuilder(CausalLM& model, uint64_t seed, c10::ScalarType dtype, Init init)
    : model_(model), gen_(at::detail::createCPUGenerator(seed)), dtype_(dtype), meta_(init == Init::kShapesOnly) {}

bool ParamBuilder::holds_group() const { return model_.holds_group(group_); }

void ParamBuilder::set_expert(int64_t local_index, std::string name_pattern) {
  expert_ = local_index;
  expert_pattern_ = std::move(name_pattern);
}

at::Tensor ParamBuilder::normal(const std::vector<int64_t>& shape, double std) {
  return meta_ ? meta_tensor(shape) : at::normal(0.0, std, shape, gen_);
}

at::Tensor ParamBuilder::uniform(const std::vector<int64_t>& shape, double low, double high) {
  return meta_ ? meta_tensor(shape) : at::empty(shape).uniform_(low, high, gen_);
}

at::Tensor ParamBuilder::ones(const std::vector<int64_t>& shape) const { return meta_ ? meta_tensor(shape) : at::ones(shape); }

at::Tensor ParamBuilder::zeros(const std::vector<int64_t>& shape) const { return meta_ ? meta_tensor(shape) : at::zeros(shape); }

at::Tensor ParamBuilder::add(const std::string& name, ParamRole role, const at::Tensor& init) {
  if (!holds_group()) return {};
  at::Tensor t = init.to(dtype_).set_requires_grad(true);
  model_.params_.push_back({name, t});
  model_.places_.push_back({group_, expert_, role, true});
  model_.expert_names_.push_back(expert_ < 0 ? std::string() : expert_pattern_);
  model_.num_groups_ = std::max(model_.num_groups_, group_ + 1);
  return t;
}

at::Tensor ParamBuilder::insert(size_t position, const std::string& name, ParamRole role, const at::Tensor& init) {
  const at::Tensor t = add(name, role, init);
  if (!t.defined() || position + 1 >= model_.params_.size()) return t;
  // Rotate the new entry (last) into `position` in every parallel list.
  auto move_last = [position](auto& list) {
    std::rotate(list.begin() + static_cast<std::ptrdiff_t>(position), list.end() - 1, list.end());
  };
  move_last(model_.params_);
  move_last(model_.places_);
  move_last(model_.expert_names_);
  for (Linear& l : model_.linears_)
    if (l.index >= position) ++l.index;
  return t;
}

void ParamBuilder::move_after(CausalLM& model, size_t mark, const std::vector<size_t>& anchors) {
  const size_t n = model.params_.size();
  if (anchors.size() != n - mark) throw Error(ErrorCode::kInternal, "ParamBuilder::move_after: one anchor per parameter added");
  std::vector<std::vector<size_t>> after(mark);
  for (size_t k = 0; k < anchors.size(); ++k) after.at(anchors[k]).push_back(mark + k);
  std::vector<size_t> order, new_index(n);
  order.reserve(n);
  for (size_t i = 0; i < mark; ++i) {
    order.push_back(i);
    order.insert(order.end(), after[i].begin(), after[i].end());
  }
  for (size_t k = 0; k < n; ++k) new_index[order[k]] = k;
  auto reorder = [&order](auto& list) {
    std::remove_reference_t<decltype(list)> moved;
    moved.reserve(list.size());
    for (const size_t i : order) moved.push_back(std::move(list[i]));
    list = std::move(moved);
  };
  reorder(model.params_);
  reorder(model.places_);
  reorder(model.expert_names_);
  for (Linear& l : model.linears_) l.index = new_index[l.index];
}

void ParamBuilder::remove(CausalLM& model, const std::vector<bool>& drop) {
  const size_t n = model.params_.size();
  if (drop.size() != n) throw Error(ErrorCode::kInternal, "ParamBuilder::remove: one flag per parameter");
  std::vector<size_t> new_index(n, std::string::npos);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)
    if (!drop[i]) new_index[i] = kept++;
  auto keep = [&drop](auto& list) {
    std::remove_reference_t<decltype(list)> left;
    left.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i)
      if (!drop[i]) left.push_back(std::move(list[i]));
    list = std::move(left);
  };
  keep(model.params_);
  keep(model.places_);
  keep(model.expert_names_);
  for (Linear& l : model.linears_) l.index = new_index[l.index];
}

const Linear* ParamBuilder::add_linear(const std::string& module, ParamRole role, const at::Tensor& init) {
  const at::Tensor weight = add(module + ".weight", role, init);
  if (!weight.defined()) return nullptr;
  Linear l;
  l.module = module;
  l.role = role;
  l.index = model_.params_.size() - 1;
  l.weight = weight;
  model_.linears_.push_back(std::move(l));
  return &model_.linears_.back();
}

}  // namespace dstrain::model
