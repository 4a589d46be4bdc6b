#include "dstrain/bench/adam_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dstrain/optim/cpu_adam.h"

namespace dstrain::optim {
namespace {

template <typename F>
double median_ms(int iters, F&& f) {
  f();  // warm-up: page faults and thread start-up out of the timing
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

// Vectorised by the compiler.
void bandwidth_reference(float* p, const float* g, float* m, float* v, int64_t n) {
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float a = p[i] + g[i], b = m[i] + v[i];
      p[i] = a;
      m[i] = b;
      v[i] = a + b;
    }
  });
}

AdamBenchResult bench_adam(int64_t params, int threads, int iters) {
  at::set_num_threads(threads);
  AdamBenchResult r;
  r.params = params;
  r.threads = threads;
  r.isa = fused_adam_isa();
  at::Tensor p = at::randn({params}), g = at::randn({params}) * 1e-2, m = at::zeros({params}), v = at::zeros({params});
  AdamHyper h{1e-4, 0.9, 0.95, 1e-8, 0.1, true, 1};
  r.fused_ms = median_ms(iters, [&] {
    fused_adam(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), params, h);
    ++h.step;
  });
  r.bandwidth_ms = median_ms(
      iters, [&] { bandwidth_reference(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), params); });
  {
    at::Tensor w = at::randn({params}).set_requires_grad(true);
    w.mutable_grad() = at::randn({params}) * 1e-2;
    torch::optim::AdamW torch_adamw({w}, torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    r.torch_ms = median_ms(iters, [&] { torch_adamw.step(); });
  }
  return r;
}

}  // namespace dstrain::optim
