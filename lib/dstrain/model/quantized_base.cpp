#include "dstrain/model/quantized_base.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/hf_fp8.h"
#include "dstrain/model/moe_experts.h"
#include "dstrain/model/nf4.h"
#include "dstrain/model/param_builder.h"

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A frozen weight in its own storage: what dequantizes it.
class StoredWeight : public LinearBase {
 public:
  virtual at::Tensor dequantized(c10::ScalarType dtype) const = 0;
  at::Tensor product(const at::Tensor& x, const at::Tensor& weight) const override;
};

// y = x Wᵀ with W dequantized for the product and again for backward (no gradient for W).
struct DequantizedLinear : torch::autograd::Function<DequantizedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const StoredWeight* stored) {
    ctx->saved_data["stored"] = reinterpret_cast<int64_t>(stored);
    return at::linear(x, stored->dequantized(x.scalar_type()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* stored = reinterpret_cast<const StoredWeight*>(ctx->saved_data["stored"].toInt());
    return {at::matmul(grads[0], stored->dequantized(grads[0].scalar_type())), at::Tensor()};
  }
};

// The stored weight outlives every graph that uses it: the model holds it (Linear::base,
// LocalExperts::*_base) for its whole life.
at::Tensor StoredWeight::product(const at::Tensor& x, const at::Tensor&) const { return DequantizedLinear::apply(x, this); }

class Nf4Stored final : public StoredWeight {
 public:
  explicit Nf4Stored(Nf4Weight q) : q_(std::move(q)) {}
  at::Tensor dequantized(c10::ScalarType dtype) const override { return dequantize_nf4(q_, dtype); }

 private:
  Nf4Weight q_;
};

class Fp8Stored final : public StoredWeight {
 public:
  Fp8Stored(Fp8Weight w, Fp8Format format) : w_(std::move(w)), format_(std::move(format)) {}
  at::Tensor dequantized(c10::ScalarType dtype) const override { return dequantize_fp8(w_.weight, w_.scale_inv, format_).to(dtype); }

 private:
  Fp8Weight w_;
  Fp8Format format_;
};

// One weight's storage, and its bytes.
struct Stored {
  std::shared_ptr<const StoredWeight> weight;
  int64_t bytes = 0;
  bool as_released = false;
};

class Quantizer {
 public:
  Quantizer(const config::Recipe& recipe, const c10::Device& device) : format_of_base_(recipe.lora.base), device_(device) {
    if (recipe.lora.base == config::LoraBase::kFp8) {
      folder_ = std::make_unique<HfWeights>(recipe.model.init_from, recipe.model);
      format_ = folder_->fp8() ? *folder_->fp8() : Fp8Format{};
    }
  }

  // `value`: the weight as loaded (the model's dtype); `name`: its name in the folder.
  Stored store(const std::string& name, const at::Tensor& value) const {
    c10::NoGradGuard no_grad;
    if (format_of_base_ == config::LoraBase::kNf4) {
      Nf4Weight q = nf4_to(quantize_nf4(value), device_);
      const int64_t bytes = q.bytes();
      return {std::make_shared<Nf4Stored>(std::move(q)), bytes, false};
    }
    std::optional<Fp8Weight> w = folder_->read_fp8(name);
    const bool as_released = w.has_value();
    if (!w) w = quantize_fp8(value.to(at::kFloat), format_);
    w->weight = w->weight.to(device_), w->scale_inv = w->scale_inv.to(device_);
    const int64_t bytes = w->weight.numel() + w->scale_inv.numel() * 4;
    return {std::make_shared<Fp8Stored>(std::move(*w), format_), bytes, as_released};
  }

 private:
  config::LoraBase format_of_base_;
  c10::Device device_;
  std::unique_ptr<HfWeights> folder_;
  Fp8Format format_;
};

void count(QuantizedBase& q, const at::Tensor& value, const Stored& s) {
  ++q.projections;
  q.elements += value.numel();
  q.bytes += s.bytes;
  q.model_bytes += value.numel() * static_cast<int64_t>(value.element_size());
  q.kept_as_released += s.as_released ? 1 : 0;
}

// The shape of `value` without its memory.
at::Tensor shape_only(const at::Tensor& value) { return at::empty(value.sizes(), value.options().device(at::kMeta)); }

// The routed experts' weights: their parameter indices, by tensor.
void quantize_experts(CausalLM& model, const Quantizer& quantizer, std::map<const void*, size_t>& index_of, std::vector<bool>& drop,
                      QuantizedBase& q) {
  for (const CausalLM::ExpertLayer& layer : model.expert_layers()) {
    LocalExperts& x = *layer.experts;
    for (auto [weights, bases] : {std::pair{&x.gate, &x.gate_base}, std::pair{&x.up, &x.up_base}, std::pair{&x.down, &x.down_base}}) {
      for (at::Tensor& w : *weights) {
        const size_t index = index_of.at(w.unsafeGetTensorImpl());
        if (model.parameter_places()[index].trains) continue;
        const Stored s = quantizer.store(model.parameters()[index].name, w);
        count(q, w, s);
        bases->push_back(s.weight);
        drop[index] = true;
        w = shape_only(w);
      }
    }
  }
}

}  // namespace

QuantizedBase quantize_base(CausalLM& model, const config::Recipe& recipe, const c10::Device& device) {
  QuantizedBase q;
  q.format = recipe.lora.base;
  if (q.format == config::LoraBase::kModel) return q;
  const Quantizer quantizer(recipe, device);
  const NamedTensors& params = model.parameters();
  std::vector<bool> drop(params.size(), false);
  for (Linear* l : model.linears()) {
    if (!stored_as_fp8(l->role) || model.parameter_places()[l->index].trains) continue;
    const Stored s = quantizer.store(params[l->index].name, l->weight);
    count(q, l->weight, s);
    l->base = s.weight;
    drop[l->index] = true;
    l->weight = shape_only(l->weight);
  }
  std::map<const void*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].tensor.unsafeGetTensorImpl()] = i;
  quantize_experts(model, quantizer, index_of, drop, q);
  ParamBuilder::remove(model, drop);
  return q;
}

std::string describe_quantized_base(const QuantizedBase& q, const std::string& dtype) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const std::string released = q.format == config::LoraBase::kFp8
                                   ? fmt::format("; {} of them as the folder stores them, {} quantized by amax / 448", q.kept_as_released,
                                                 q.projections - q.kept_as_released)
                                   : std::string(" (bitsandbytes' NF4, blocks of 64, double quantization)");
  return fmt::format("lora: base in {}: {} frozen projections ({:.3f}M weights), {:.1f} MiB on this rank ({:.1f} MiB in {}){}",
                     q.format == config::LoraBase::kNf4 ? "NF4" : "FP8", q.projections, static_cast<double>(q.elements) / 1e6,
                     static_cast<double>(q.bytes) / kMiB, static_cast<double>(q.model_bytes) / kMiB, dtype, released);
}

}  // namespace dstrain::model
