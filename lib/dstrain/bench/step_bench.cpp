// `dstrain bench optimizer`'s step rows: the fused optimizer step against the engine's previous
// one on the same bf16 model-shaped buffers (see adam_bench.h).
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dstrain/bench/adam_bench.h"
#include "dstrain/optim/device_adam.h"
#include "dstrain/optim/fused_step.h"

namespace dstrain::optim {
namespace {

constexpr int64_t kMatrix = int64_t{4} << 20, kNorm = 2048;

// Waits for the device's queued work (a no-op on the CPU).
void settle(const c10::Device& device) {
  if (!device.is_cuda()) return;
  c10::Event done(device.type());
  done.record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
  done.synchronize();
}

template <typename F>
double timed_ms(const c10::Device& device, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  settle(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The median of all but the first (the warm-up: page faults, thread start-up).
double median_after_first(std::vector<double> ms) {
  ms.erase(ms.begin());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename F>
double median_ms(const c10::Device& device, int iters, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) ms.push_back(timed_ms(device, f));
  return median_after_first(ms);
}

}  // namespace

StepBenchResult bench_optimizer_step(c10::Device device, int64_t params, int iters) {
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor master = at::randn({params}, fp32), m = at::zeros({params}, fp32), v = at::zeros({params}, fp32);
  at::Tensor grad = (at::randn({params}, fp32) * 1e-2).to(at::kBFloat16), out = master.to(at::kBFloat16);
  std::vector<StepRun> runs;
  for (int64_t at = 0, i = 0; at < params; ++i) {
    const int64_t n = std::min(i % 2 == 0 ? kMatrix : kNorm, params - at);
    runs.push_back({master.data_ptr<float>() + at, m.data_ptr<float>() + at, v.data_ptr<float>() + at,
                    static_cast<const char*>(grad.data_ptr()) + at * 2, static_cast<char*>(out.data_ptr()) + at * 2, n, i % 2 == 0});
    at += n;
  }
  StepBenchResult r;
  r.params = params;
  r.runs = static_cast<int64_t>(runs.size());
  AdamHyper h{1e-4, 0.9, 0.95, 1e-8, 0.1, true, 1};
  const FusedStep fused(device, at::kBFloat16, runs);
  volatile double sink = 0;
  r.fused_ms = median_ms(device, iters, [&] {
    sink = fused.grad_sum_squares();
    fused.apply(h, 0.5f);
    ++h.step;
  });
  r.norm_ms = median_ms(device, iters, [&] { sink = fused.grad_sum_squares(); });
  if (device.is_cpu()) {  // the update and the reference in turns: the same noise for both
    at::Tensor p = at::randn({params}), g = at::randn({params}), m2 = at::zeros({params}), v2 = at::zeros({params});
    std::vector<double> update, reference;
    for (int i = 0; i < iters + 1; ++i) {
      update.push_back(timed_ms(device, [&] {
        fused.apply(h, 0.5f);
        ++h.step;
      }));
      reference.push_back(timed_ms(device, [&] {
        bandwidth_reference(p.data_ptr<float>(), g.data_ptr<float>(), m2.data_ptr<float>(), v2.data_ptr<float>(), params);
      }));
    }
    r.update_ms = median_after_first(update);
    r.reference_ms = median_after_first(reference);
  } else {
    r.update_ms = median_ms(device, iters, [&] {
      fused.apply(h, 0.5f);
      ++h.step;
    });
  }
  r.previous_ms = median_ms(device, iters, [&] {
    std::vector<at::Tensor> pieces;
    for (const StepRun& run : runs) pieces.push_back(grad.narrow(0, run.master - master.data_ptr<float>(), run.n));
    const at::Tensor g32 = at::cat(pieces).to(at::kFloat);
    at::Tensor sq = at::zeros({}, fp32.dtype(at::kDouble));
    for (int64_t at = 0; at < params; at += int64_t{1} << 20)
      sq += g32.narrow(0, at, std::min(int64_t{1} << 20, params - at)).to(at::kDouble).pow(2).sum();
    sink = sq.item<double>();
    for (const StepRun& run : runs) {
      AdamHyper hr = h;
      if (!run.decay) hr.weight_decay = 0;
      const int64_t at = run.master - master.data_ptr<float>();
      fused_adam_on(device, run.master, g32.data_ptr<float>() + at, run.exp_avg, run.exp_avg_sq, run.n, hr, 0.5f);
      out.narrow(0, at, run.n).copy_(master.narrow(0, at, run.n));
    }
    ++h.step;
  });
  (void)sink;
  return r;
}

}  // namespace dstrain::optim
