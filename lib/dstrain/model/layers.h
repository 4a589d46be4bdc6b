#pragma once
// Building blocks shared by the model families, as plain functions of tensors.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::model {

// HF RMSNorm: computed in at least fp32, cast back, times weight. On a GPU, ATen's fused kernel
// (_fused_rms_norm: one pass forward and one backward, fp32 inside, one rounding at the end
// instead of two); on the CPU the composite below, transformers' exact roundings.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps);
// rms_norm, recomputed in backward from x when `recompute_in_backward` (selective checkpointing).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool recompute_in_backward);
// SwiGLU MLP: down(silu(gate(x)) * up(x)), from its three projections. recompute_activation:
// silu(gate) * up is recomputed in backward from the two projections (selective activation
// checkpointing).
using Projection = std::function<at::Tensor(const at::Tensor&)>;
at::Tensor swiglu(const at::Tensor& x, const Projection& gate, const Projection& up, const Projection& down, bool recompute_activation);
// The same over plain weights (a routed expert's).
at::Tensor swiglu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                  bool recompute_activation = false);

// An fp32 tensor of `shape` on the meta device: a shape without memory (Init::kShapesOnly).
at::Tensor meta_tensor(const std::vector<int64_t>& shape);

// YaRN's mscale: 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1).
double yarn_get_mscale(double scale, double mscale);
// The factor DeepSeek's attention multiplies its softmax scale by under RoPE scaling:
// yarn_get_mscale(factor, mscale_all_dim)^2, or 1 (no scaling, or no mscale_all_dim).
double deepseek_softmax_mscale(const config::ModelConfig& config);

// RoPE with the half-split (rotate_half) layout: tables cos/sin [max_len, dim]. Plain, or with the
// model's scaling (config.rope_scaling) exactly as Hugging Face computes it: linear divides the
// frequencies by the factor; YaRN interpolates the low frequencies, keeps the high ones (a linear
// ramp between the beta_fast and beta_slow dims) and scales cos/sin by its attention factor.
struct Rope {
  at::Tensor cos, sin;
  Rope() = default;
  Rope(int64_t dim, int64_t max_len, double theta, c10::ScalarType dtype);
  Rope(int64_t dim, const config::ModelConfig& config, c10::ScalarType dtype);
  // x: [B, heads, T, dim]; positions int64 [B, T] (undefined: 0..T-1 in every row, the fused path).
  at::Tensor apply(const at::Tensor& x, const at::Tensor& positions = {}) const;
  void move_to(const c10::Device& device);
};

}  // namespace dstrain::model
