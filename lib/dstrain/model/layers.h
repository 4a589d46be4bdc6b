#pragma once
// Building blocks shared by the model families, as plain functions of tensors.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dstrain::model {

// HF RMSNorm: computed in at least fp32, cast back, times weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// SwiGLU MLP: down(silu(gate(x)) * up(x)).
at::Tensor swiglu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down);

// RoPE with the half-split (rotate_half) layout: tables cos/sin [max_len, dim].
struct Rope {
  at::Tensor cos, sin;
  Rope() = default;
  Rope(int64_t dim, int64_t max_len, double theta, c10::ScalarType dtype);
  // x: [..., T, dim]
  at::Tensor apply(const at::Tensor& x) const;
  void move_to(const c10::Device& device);
};

}  // namespace dstrain::model
