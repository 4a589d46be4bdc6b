#pragma once
// The dense DeepSeek model (LLaMA-style: RMSNorm, RoPE with the half-split layout, causal
// multi-head attention, SwiGLU MLP, untied lm_head), built from its parts (model/linear.h,
// model/attention.h) over named parameters with their Hugging Face names and a stable order.
#include <cstdint>
#include <memory>

#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

class DenseModel final : public CausalLM {
 public:
  // Parameters are initialised from `seed` alone: every rank builds the same weights.
  DenseModel(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype = c10::ScalarType::Float, Init init = Init::kRandom,
             const HeldGroups& held = {});
  ~DenseModel() override;
  DenseModel(const DenseModel&) = delete;
  DenseModel& operator=(const DenseModel&) = delete;

  void move_buffers_to(const c10::Device& device) override;

  struct Impl;  // defined in the .cpp; public so that the layer helpers there can take it

 protected:
  Trunk trunk(int first, int last, const at::Tensor& x, const Input& input, at::Tensor* aux) const override;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::model
