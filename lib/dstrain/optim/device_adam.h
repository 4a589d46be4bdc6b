#pragma once
// The fused Adam/AdamW step on whichever device holds the optimizer state: the CPU kernel
// (cpu_adam.h) for host memory, the CUDA kernel (cuda/adam.cu, on the current stream) for a GPU.
// Both use the same per-element math and coefficients.
#include <c10/core/Device.h>

#include <cstdint>

#include "dstrain/optim/cpu_adam.h"

namespace dstrain::optim {

// p, g, m, v: n floats each, all on `device`. Throws Error{kEnvironment} for a GPU when dstrain
// was built without CUDA, and Error{kInternal} when the kernel launch fails.
void fused_adam_on(c10::Device device, float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale);

// "cuda" on a GPU, else the CPU kernel's instruction set (fused_adam_isa()).
std::string fused_adam_kind(c10::Device device);

}  // namespace dstrain::optim
