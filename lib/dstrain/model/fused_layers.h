#pragma once
// Element-wise layers fused into one CUDA kernel each way on a GPU (cuda/fused_layers.cu, as
// custom autograd functions); on the CPU, or for layouts the kernels do not take, the composite
// ATen code, unchanged. The GPU tests compare both forms' outputs and gradients.
#include <ATen/core/Tensor.h>

namespace dstrain::model {

// silu(gate) * up (SwiGLU's activation).
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor silu_mul_composite(const at::Tensor& gate, const at::Tensor& up);

// Rotary embeddings with the half-split layout on x [..., T, dim], positions 0..T-1, tables
// cos/sin [>= T, dim]: x cos + rotate_half(x) sin. Fused when x is a GPU tensor whose storage
// is [B, T, heads, dim] (the usual transposed view [B, heads, T, dim]) of the tables' type.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Whether the fused kernels are used for GPU tensors (DSTRAIN_FUSED_LAYERS=0 turns them off, to
// compare; on by default in a CUDA build).
bool fused_layers_enabled();

}  // namespace dstrain::model
