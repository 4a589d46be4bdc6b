#include "dstrain/optim/device_adam.h"

#include <string>

#include "dstrain/core/error.h"
#include "dstrain_cuda.h"

#ifdef DSTRAIN_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace dstrain::optim {

void fused_adam_on(c10::Device device, float* p, const float* g, float* m, float* v, int64_t n, const AdamHyper& h, float grad_scale) {
  if (device.is_cpu()) {
    fused_adam(p, g, m, v, n, h, grad_scale);
    return;
  }
#ifdef DSTRAIN_WITH_CUDA
  const DstrainAdamParams params{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.adamw ? 1 : 0, static_cast<long long>(h.step)};
  // The stream the engine's other work on this device is ordered on (PyTorch's current stream).
  void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (const int rc = dstrain_cuda_adam_f32(p, g, m, v, static_cast<size_t>(n), &params, grad_scale, stream); rc != 0)
    throw Error(ErrorCode::kInternal, std::string("the CUDA Adam kernel failed to launch: ") + dstrain_cuda_error_string(rc),
                "check the GPU with nvidia-smi and `dstrain check-env`; this may be a dstrain bug");
#else
  (void)p, (void)g, (void)m, (void)v, (void)n, (void)h, (void)grad_scale;
  throw Error(ErrorCode::kEnvironment, "the optimizer state is on " + device.str() + " but this dstrain was built without CUDA",
              "build dstrain with DSTRAIN_CUDA=ON on a machine with nvcc, NCCL and a CUDA LibTorch");
#endif
}

std::string fused_adam_kind(c10::Device device) { return device.is_cpu() ? fused_adam_isa() : "cuda"; }

}  // namespace dstrain::optim
