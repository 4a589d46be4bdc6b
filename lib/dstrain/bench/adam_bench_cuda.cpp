// `dstrain bench optimizer --device cuda`: the fused CUDA Adam kernel against torch::optim::AdamW
// on the GPU and a device-to-device copy with the same traffic (28 bytes per parameter), all in
// this process. Only runs where a GPU is visible.
#include "dstrain/core/error.h"
#include "dstrain/bench/adam_bench.h"

#ifdef DSTRAIN_WITH_CUDA  // a build with the CUDA kernels (and a CUDA LibTorch)
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dstrain_cuda.h"

namespace dstrain::optim {
namespace {

template <typename F>
double median_device_ms(int iters, F&& f) {
  f();
  c10::cuda::device_synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    c10::cuda::device_synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

AdamBenchResult bench_adam_cuda(int64_t params, int iters) {
  if (!dstrain_cuda_built() || !at::hasCUDA() || dstrain_cuda_device_count() == 0)
    throw Error(ErrorCode::kEnvironment, "bench optimizer --device cuda needs a visible GPU and a CUDA build of dstrain",
                "run it on a GPU machine (scripts/gpu-check.sh does), or use --device cpu");
  AdamBenchResult r;
  r.params = params;
  r.isa = "cuda";
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor p = at::randn({params}, cuda), g = at::randn({params}, cuda) * 1e-2, m = at::zeros({params}, cuda),
             v = at::zeros({params}, cuda);
  DstrainAdamParams h{1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1};
  int rc = 0;
  r.fused_ms = median_device_ms(iters, [&] {
    rc |= dstrain_cuda_adam_f32(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                                static_cast<size_t>(params), &h, 1.0f, nullptr);
    ++h.step;
  });
  if (rc != 0) throw Error(ErrorCode::kEnvironment, std::string("the CUDA Adam kernel failed: ") + dstrain_cuda_error_string(rc), "");
  {  // The same 28 bytes per parameter as one copy: 14 bytes read and 14 written.
    at::Tensor src = at::empty({params * 7 / 2}, cuda), dst = at::empty({params * 7 / 2}, cuda);
    r.bandwidth_ms = median_device_ms(iters, [&] { dst.copy_(src); });
  }
  {
    at::Tensor w = at::randn({params}, cuda).set_requires_grad(true);
    w.mutable_grad() = at::randn({params}, cuda) * 1e-2;
    torch::optim::AdamW torch_adamw({w}, torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    r.torch_ms = median_device_ms(iters, [&] { torch_adamw.step(); });
  }
  return r;
}

}  // namespace dstrain::optim
#else

namespace dstrain::optim {

AdamBenchResult bench_adam_cuda(int64_t, int) {
  throw Error(ErrorCode::kEnvironment, "this dstrain was built without CUDA",
              "build on a machine with nvcc, NCCL and a CUDA LibTorch (DSTRAIN_CUDA=ON)");
}

}  // namespace dstrain::optim
#endif
