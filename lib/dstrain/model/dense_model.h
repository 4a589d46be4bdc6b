#pragma once
// The dense DeepSeek model (LLaMA-style: RMSNorm, RoPE with the half-split layout, causal
// multi-head attention, SwiGLU MLP, untied lm_head), written with plain ATen ops over named
// fp32 parameters so that every tensor has its Hugging Face name and a stable order.
#include <cstdint>
#include <memory>

#include "dstrain/config/recipe.h"
#include "dstrain/model/named_tensor.h"

namespace dstrain::model {

class DenseModel {
 public:
  // Parameters are initialised from `seed` alone: every rank builds the same weights.
  DenseModel(const config::ModelConfig& config, uint64_t seed);
  ~DenseModel();
  DenseModel(const DenseModel&) = delete;
  DenseModel& operator=(const DenseModel&) = delete;

  // Logits [B, T, vocab] for int64 `inputs` [B, T].
  at::Tensor logits(const at::Tensor& inputs) const;
  // Mean next-token cross-entropy of int64 `inputs` [B, T] against `targets` [B, T].
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) const;
  // Parameters in a fixed order with HF names (model.layers.{i}.self_attn.q_proj.weight, ...).
  const NamedTensors& parameters() const;
  int64_t num_parameters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::model
