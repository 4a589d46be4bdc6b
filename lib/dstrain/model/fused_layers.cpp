#include "dstrain/model/fused_layers.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "dstrain/core/cuda_elem.h"
#include "dstrain/core/error.h"
#include "dstrain_cuda.h"

#ifdef DSTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool fusable(const at::Tensor& t) { return fused_layers_enabled() && t.is_cuda() && cuda_elem_code(t.scalar_type()) >= 0; }

#ifdef DSTRAIN_WITH_CUDA
void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

void check(int rc, const char* what) {
  if (rc != 0)
    throw Error(ErrorCode::kInternal, std::string("the fused CUDA ") + what + " kernel failed: " + dstrain_cuda_error_string(rc),
                "set DSTRAIN_FUSED_LAYERS=0 to use ATen's kernels instead, and report this");
}

struct SiluMul : torch::autograd::Function<SiluMul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g);
    check(dstrain_cuda_swiglu_forward(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), cuda_elem_code(g.scalar_type()), stream_of(g)),
          "SwiGLU");
    ctx->save_for_backward({g, u});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = saved[0];
    const c10::cuda::CUDAGuard guard(g.device());
    const at::Tensor d = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor grad_gate = at::empty_like(g), grad_up = at::empty_like(g);
    check(dstrain_cuda_swiglu_backward(d.data_ptr(), g.data_ptr(), saved[1].data_ptr(), grad_gate.data_ptr(), grad_up.data_ptr(), g.numel(),
                                       cuda_elem_code(g.scalar_type()), stream_of(g)),
          "SwiGLU backward");
    return {grad_gate, grad_up};
  }
};

// x: contiguous [B, T, heads, dim].
at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  at::Tensor out = at::empty_like(x);
  const int64_t rows = x.numel() / x.size(3);
  check(dstrain_cuda_rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), rows, static_cast<int>(x.size(2)),
                          static_cast<int>(x.size(1)), static_cast<int>(x.size(3)), backward ? 1 : 0, cuda_elem_code(x.scalar_type()),
                          stream_of(x)),
        "RoPE");
  return out;
}

struct RopeRows : torch::autograd::Function<RopeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const c10::cuda::CUDAGuard guard(x.device());
    ctx->save_for_backward({cos, sin});
    return rope_rows(x, cos, sin, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const c10::cuda::CUDAGuard guard(saved[0].device());
    return {rope_rows(grads[0].to(saved[0].scalar_type()).contiguous(), saved[0], saved[1], true), at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

bool fused_layers_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DSTRAIN_FUSED_LAYERS");
    return dstrain_cuda_built() && !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

at::Tensor silu_mul_composite(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
#ifdef DSTRAIN_WITH_CUDA
  if (fusable(gate) && up.device() == gate.device() && up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes())
    return SiluMul::apply(gate, up);
#endif
  return silu_mul_composite(gate, up);
}

at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t T = x.size(-2), half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.narrow(0, 0, T) + rotated * sin.narrow(0, 0, T);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#ifdef DSTRAIN_WITH_CUDA
  // [B, heads, T, dim] whose storage is [B, T, heads, dim]: the kernel works on the rows as stored.
  if (fusable(x) && x.dim() == 4 && x.size(3) % 2 == 0 && cos.scalar_type() == x.scalar_type() && cos.is_contiguous() &&
      sin.is_contiguous() && cos.size(0) >= x.size(2) && x.transpose(1, 2).is_contiguous())
    return RopeRows::apply(x.transpose(1, 2), cos, sin).transpose(1, 2);
#endif
  return rope_composite(x, cos, sin);
}

}  // namespace dstrain::model
