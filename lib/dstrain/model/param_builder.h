#pragma once
// How a model family declares its parameters: one call per parameter with its HF name, role and
// initial values, in the model's order. The builder draws the initial values from one stream
// seeded by the model's seed (drawn whether or not this rank keeps the parameter: every rank,
// pipeline stage and expert block draws the same stream, so the same model), keeps what the
// model holds, and records each parameter's place and, for a projection, its Linear.
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

class ParamBuilder {
 public:
  ParamBuilder(CausalLM& model, uint64_t seed, c10::ScalarType dtype, Init init);

  // The layer group of what is added next (LayerGate's numbering).
  void set_group(int group) { group_ = group; }
  bool holds_group() const;
  // What is added next belongs to a routed expert: its index in this rank's block and its name
  // with "{}" for the global index; end_expert() returns to the model's own parameters.
  void set_expert(int64_t local_index, std::string name_pattern);
  void end_expert() { expert_ = -1; }

  // Initial values, drawn from the stream in call order (meta tensors for Init::kShapesOnly).
  at::Tensor normal(const std::vector<int64_t>& shape, double std);
  at::Tensor uniform(const std::vector<int64_t>& shape, double low, double high);
  at::Tensor zeros(const std::vector<int64_t>& shape) const;
  at::Tensor ones(const std::vector<int64_t>& shape) const;

  // Adds a parameter when its group is held; returns it (undefined when not held).
  at::Tensor add(const std::string& name, ParamRole role, const at::Tensor& init);
  // The same at `position` in the model's order (an adapter beside its projection, once the
  // model is built: the engine wants each layer group's parameters together); later parameters
  // and their Linears move up by one.
  at::Tensor insert(size_t position, const std::string& name, ParamRole role, const at::Tensor& init);
  // Moves the parameters added since the model held `mark` of them each right after its anchor
  // (anchors[k] for the k-th added, an index below mark; several after one anchor keep their
  // order), in one pass: later parameters and their Linears move up. Adapters beside many
  // projections (every routed expert's) at once, where insert() would move the list each time.
  static void move_after(CausalLM& model, size_t mark, const std::vector<size_t>& anchors);
  // Takes the parameters with drop[i] out of the model (a frozen base that another storage now
  // holds: model/quantized_base.h); the others keep their order. A dropped projection's Linear
  // stays (its weight the caller's to replace) with index npos.
  static void remove(CausalLM& model, const std::vector<bool>& drop);
  // A projection: the parameter module + ".weight" [out, in] and its Linear (nullptr when not held).
  const Linear* add_linear(const std::string& module, ParamRole role, const at::Tensor& init);
  // An RMSNorm's weight of `size`, initialised to ones.
  at::Tensor add_norm(const std::string& name, int64_t size) { return add(name, ParamRole::kNorm, ones({size})); }

 private:
  CausalLM& model_;
  at::Generator gen_;
  c10::ScalarType dtype_;
  bool meta_;
  int group_ = 0;
  int64_t expert_ = -1;
  std::string expert_pattern_;
};

}  // namespace dstrain::model
