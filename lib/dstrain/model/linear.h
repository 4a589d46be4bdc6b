#pragma once
// A projection y = x Wᵀ as a part of the model: the families hold a Linear (resolved once, when
// the model is built) and run every projection through apply(). What later features attach goes
// here, not into the families:
//   base     how the product with the base weight is computed (a quantized base with its scales,
//            an FP8 matmul); none: at::linear
//   adapters what is added to (or reshapes) the output, in order (LoRA, DoRA); each sees x and
//            the output so far
// The weight is the model's parameter itself (the same tensor: ZeRO repoints its storage and the
// handle follows).
#include <ATen/core/Tensor.h>

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/model/param_role.h"

namespace dstrain::model {

class LinearBase {
 public:
  virtual ~LinearBase() = default;
  virtual at::Tensor product(const at::Tensor& x, const at::Tensor& weight) const = 0;
};

class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // The linear's output from its input and the output so far.
  virtual at::Tensor apply(const at::Tensor& x, const at::Tensor& output) const = 0;
};

struct Linear {
  std::string module;  // Hugging Face's module name (model.layers.0.self_attn.q_proj); the weight is module + ".weight"
  ParamRole role = ParamRole::kAttention;
  size_t index = 0;   // the weight's place in CausalLM::parameters()
  at::Tensor weight;  // [out, in]
  std::shared_ptr<const LinearBase> base;
  std::vector<std::shared_ptr<const LinearAdapter>> adapters;

  int64_t out_features() const { return weight.size(0); }
  int64_t in_features() const { return weight.size(1); }
};

// The rows a training forward computes, as places in the global sample order (the batch's first
// row; the others follow it), so that a random choice made for a row (LoRA's dropout) is the same
// on whichever rank, micro-batch, pipeline stage or recomputation makes it. CausalLM's forwards
// set it from their Input (recompute() carries it into backward); none in evaluation.
// Sequence parallelism: the forward holds share `share` of `shares` equal, consecutive parts of
// each row's tokens (a choice made for the whole row is cut to that part).
struct TrainingRows {
  int64_t first = -1;
  int64_t count = 0;
  int share = 0, shares = 1;
  bool active() const { return first >= 0 && count > 0; }
};
const TrainingRows& current_training_rows();
// Sets the current rows for its lifetime (this thread).
class TrainingRowsScope {
 public:
  explicit TrainingRowsScope(TrainingRows rows);
  ~TrainingRowsScope();
  TrainingRowsScope(const TrainingRowsScope&) = delete;
  TrainingRowsScope& operator=(const TrainingRowsScope&) = delete;

 private:
  TrainingRows previous_;
};

// Whether adapters (LoRA, DoRA; the routed experts' too) apply on this thread. AdaptersOff turns
// them off for its lifetime: the frozen base alone, preference tuning's live reference with LoRA
// (PEFT's disable_adapter).
bool adapters_on();
class AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  bool previous_;
};

// x [..., in] -> [..., out]. compute: the product in that dtype (x and the weight converted; the
// MoE router runs in fp32 whatever the model's dtype).
at::Tensor apply(const Linear& linear, const at::Tensor& x, std::optional<c10::ScalarType> compute = std::nullopt);

}  // namespace dstrain::model
