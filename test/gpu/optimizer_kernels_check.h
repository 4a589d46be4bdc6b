#pragma once
// The fused optimizer kernels against a LibTorch reference computed in double on the CPU: odd
// sizes, guard elements after the buffers (poisoned with NaN: a kernel must not touch them),
// inf/nan gradients. What gpu.kernels checks with the CUDA kernels, and what the CPU suite runs
// with the CPU kernels (optim/cpu_adam.h) through the same code, so that the checks' plumbing
// (buffers, guards, the reference, the tolerance) cannot reach the GPU broken.
//
// A Backend has: Buffer(const at::Tensor& host) (n floats and kGuard poisoned ones after them),
// Buffer::ptr, Buffer::fetch() (the n floats, after checking the guard is still poisoned);
// adam(p, g, m, v, n, params, grad_scale); sum_squares(x, n) -> double.
#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch_torch.h"
#include "dstrain/optim/cpu_adam.h"
#include "dstrain_cuda.h"

namespace dstrain::test {

constexpr int64_t kGuard = 64;

inline std::vector<float> guarded(const at::Tensor& host) {
  const int64_t n = host.numel();
  std::vector<float> padded(static_cast<size_t>(n + kGuard), std::numeric_limits<float>::quiet_NaN());
  if (n > 0) std::memcpy(padded.data(), host.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
  return padded;
}

// The n elements of a guarded buffer, after checking its guard.
inline at::Tensor unguarded(std::vector<float> padded, int64_t n) {
  for (int64_t i = n; i < n + kGuard; ++i) REQUIRE(std::isnan(padded[static_cast<size_t>(i)]));
  return at::from_blob(padded.data(), {n}, at::kFloat).clone();
}

// The CPU kernels (what every CPU step and offload_optimizer use).
struct CpuKernels {
  struct Buffer {
    std::vector<float> host;
    float* ptr;
    int64_t n;
    explicit Buffer(const at::Tensor& t) : host(guarded(t)), ptr(host.data()), n(t.numel()) {}
    at::Tensor fetch() const { return unguarded(host, n); }
  };
  static void adam(Buffer& p, Buffer& g, Buffer& m, Buffer& v, int64_t n, const DstrainAdamParams& h, float scale) {
    optim::AdamHyper hyper;
    hyper.lr = h.lr, hyper.beta1 = h.beta1, hyper.beta2 = h.beta2, hyper.eps = h.eps, hyper.weight_decay = h.weight_decay;
    hyper.adamw = h.adamw != 0, hyper.step = h.step;
    optim::fused_adam(p.ptr, g.ptr, m.ptr, v.ptr, n, hyper, scale);
  }
  static double sum_squares(const Buffer& x, int64_t n) { return optim::sum_squares(x.ptr, optim::AdamElem::kFloat, n); }
};

// LibTorch reference in double: the same update as cpu_adam.cpp.
inline void reference_update(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const DstrainAdamParams& h, double scale) {
  at::Tensor grad = g.to(at::kDouble) * scale;
  at::Tensor param = p.to(at::kDouble);
  if (!h.adamw) grad = grad + h.weight_decay * param;
  at::Tensor mi = m.to(at::kDouble) * h.beta1 + grad * (1 - h.beta1);
  at::Tensor vi = v.to(at::kDouble) * h.beta2 + grad * grad * (1 - h.beta2);
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.step)), bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  if (h.adamw) param = param * (1 - h.lr * h.weight_decay);
  param = param - (h.lr / bc1) * mi / (vi.sqrt() / std::sqrt(bc2) + h.eps);
  p = param.to(at::kFloat), m = mi.to(at::kFloat), v = vi.to(at::kFloat);
}

// |got - want| <= 1e-6 (|want| + rms(want)), reported as the worst ratio of error to tolerance.
// Relative where a value is not tiny (1e-6 is ~8 float32 ulps); where the reference nearly
// cancels (exp_avg = beta1 m + (1 - beta1) g with terms of opposite sign), float32 arithmetic can
// only be asked for the rounding of its terms, so the floor is at the tensor's own scale (its
// RMS), not at an arbitrary 1e-6 that made 1e-4 "relative" errors of values near 1e-6.
inline void check_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  const at::Tensor finite = want.isfinite();
  CHECK(at::equal(got.isfinite(), finite));  // inf/nan exactly where the reference has them
  const at::Tensor g = got.masked_select(finite).to(at::kDouble), w = want.masked_select(finite).to(at::kDouble);
  if (g.numel() == 0) return;
  const double rms = w.square().mean().sqrt().item<double>();
  const at::Tensor tolerance = (w.abs() + rms) * 1e-6;
  const at::Tensor ratio = (g - w).abs() / tolerance;
  const int64_t worst = ratio.argmax().item<int64_t>();
  INFO(what << ": worst error " << (g[worst] - w[worst]).abs().item<double>() << " at a reference value of " << w[worst].item<double>()
            << " (tensor RMS " << rms << "), " << ratio[worst].item<double>() << " x the tolerance");
  CHECK(ratio[worst].item<double>() <= 1.0);
}

template <typename Kernels>
void check_adam_against_reference() {
  for (const int adamw : {1, 0}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{1023}, (int64_t{1} << 20) + 7}) {
      at::manual_seed(static_cast<uint64_t>(n) * 2 + static_cast<uint64_t>(adamw));
      at::Tensor p = at::randn({n}), g = at::randn({n}) * 1024.0, m = at::randn({n}) * 0.1, v = at::rand({n}) * 0.01;
      const DstrainAdamParams h{3e-4, 0.9, 0.95, 1e-8, 0.1, adamw, 7};
      const float scale = 1.0f / 1024.0f;
      typename Kernels::Buffer dp(p), dg(g), dm(m), dv(v);
      Kernels::adam(dp, dg, dm, dv, n, h, scale);
      reference_update(p, g, m, v, h, scale);
      INFO((adamw ? "AdamW" : "Adam") << ", n = " << n);
      check_close(dp.fetch(), p, "param");
      check_close(dm.fetch(), m, "exp_avg");
      check_close(dv.fetch(), v, "exp_avg_sq");
      CHECK(at::equal(dg.fetch(), g));  // the gradient is read, never written
    }
  }
}

template <typename Kernels>
void check_adam_nonfinite() {
  const int64_t n = 4099;
  at::manual_seed(5);
  at::Tensor p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  g[0] = std::numeric_limits<float>::infinity();
  g[2048] = std::numeric_limits<float>::quiet_NaN();
  g[n - 1] = -std::numeric_limits<float>::infinity();
  const DstrainAdamParams h{1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1};
  typename Kernels::Buffer dp(p), dg(g), dm(m), dv(v);
  Kernels::adam(dp, dg, dm, dv, n, h, 1.0f);
  reference_update(p, g, m, v, h, 1.0);
  check_close(dp.fetch(), p, "param");
  check_close(dm.fetch(), m, "exp_avg");
}

template <typename Kernels>
void check_sum_squares() {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{257}, int64_t{1} << 20, (int64_t{1} << 22) + 3}) {
    std::vector<float> values(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<float> dist(0.0f, 2.0f);
    double want = 0.0;
    for (auto& x : values) x = dist(rng), want += static_cast<double>(x) * x;
    const typename Kernels::Buffer buffer(at::from_blob(values.data(), {n}, at::kFloat));
    INFO("n = " << n);
    CHECK(Kernels::sum_squares(buffer, n) == Approx(want).epsilon(1e-12).margin(1e-12));
    CHECK(at::equal(buffer.fetch(), at::from_blob(values.data(), {n}, at::kFloat)));  // read, never written
  }
}

}  // namespace dstrain::test
