// The fused CUDA optimizer kernels against a LibTorch reference computed in double on the CPU:
// odd sizes, guard elements after the buffers (poisoned with NaN: the kernels must not touch
// them), inf/nan gradients, and the overflow flag.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dstrain/device/pinned_memory.h"
#include "dstrain_cuda.h"

namespace {

constexpr int64_t kGuard = 64;
const float kPoison = std::numeric_limits<float>::quiet_NaN();

struct DeviceBuffer {
  float* ptr = nullptr;
  int64_t n = 0;
  explicit DeviceBuffer(const at::Tensor& host) : n(host.numel()) {
    std::vector<float> padded(static_cast<size_t>(n + kGuard), kPoison);
    std::memcpy(padded.data(), host.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
    REQUIRE(cudaMalloc(&ptr, padded.size() * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, padded.data(), padded.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  // The n elements, after checking the guard is still poisoned.
  at::Tensor fetch() const {
    std::vector<float> padded(static_cast<size_t>(n + kGuard));
    REQUIRE(cudaMemcpy(padded.data(), ptr, padded.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int64_t i = n; i < n + kGuard; ++i) REQUIRE(std::isnan(padded[static_cast<size_t>(i)]));
    return at::from_blob(padded.data(), {n}, at::kFloat).clone();
  }
};

// LibTorch reference in double: the same update as cpu_adam.cpp.
void reference(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const DstrainAdamParams& h, double scale) {
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
void check_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
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

}  // namespace

TEST_CASE("fused CUDA Adam and AdamW match LibTorch in double", "[gpu]") {
  for (const int adamw : {1, 0}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{1023}, (int64_t{1} << 20) + 7}) {
      at::manual_seed(static_cast<uint64_t>(n) * 2 + static_cast<uint64_t>(adamw));
      at::Tensor p = at::randn({n}), g = at::randn({n}) * 1024.0, m = at::randn({n}) * 0.1, v = at::rand({n}) * 0.01;
      const DstrainAdamParams h{3e-4, 0.9, 0.95, 1e-8, 0.1, adamw, 7};
      const float scale = 1.0f / 1024.0f;
      DeviceBuffer dp(p), dg(g), dm(m), dv(v);
      REQUIRE(dstrain_cuda_adam_f32(dp.ptr, dg.ptr, dm.ptr, dv.ptr, static_cast<size_t>(n), &h, scale, nullptr) == 0);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      reference(p, g, m, v, h, scale);
      INFO((adamw ? "AdamW" : "Adam") << ", n = " << n);
      check_close(dp.fetch(), p, "param");
      check_close(dm.fetch(), m, "exp_avg");
      check_close(dv.fetch(), v, "exp_avg_sq");
      const at::Tensor grads_after = dg.fetch();  // the gradient is read, never written
      CHECK(at::equal(grads_after, g));
    }
  }
}

TEST_CASE("fused CUDA Adam carries inf and nan gradients where the reference does", "[gpu]") {
  const int64_t n = 4099;
  at::manual_seed(5);
  at::Tensor p = at::randn({n}), g = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
  g[0] = std::numeric_limits<float>::infinity();
  g[2048] = std::numeric_limits<float>::quiet_NaN();
  g[n - 1] = -std::numeric_limits<float>::infinity();
  const DstrainAdamParams h{1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1};
  DeviceBuffer dp(p), dg(g), dm(m), dv(v);
  REQUIRE(dstrain_cuda_adam_f32(dp.ptr, dg.ptr, dm.ptr, dv.ptr, static_cast<size_t>(n), &h, 1.0f, nullptr) == 0);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  reference(p, g, m, v, h, 1.0);
  check_close(dp.fetch(), p, "param");
  check_close(dm.fetch(), m, "exp_avg");
}

TEST_CASE("unscale multiplies in place and raises the overflow flag for any inf or nan", "[gpu]") {
  int* flag = nullptr;
  REQUIRE(cudaMalloc(&flag, sizeof(int)) == cudaSuccess);
  for (const int64_t n : {int64_t{1}, int64_t{257}, (int64_t{1} << 20) + 3}) {
    for (const int64_t bad_at : {int64_t{-1}, int64_t{0}, n / 2, n - 1}) {
      for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        at::manual_seed(static_cast<uint64_t>(n + bad_at));
        at::Tensor g = at::randn({n}) * 65536.0;
        if (bad_at >= 0) g[bad_at] = bad;
        DeviceBuffer dg(g);
        REQUIRE(cudaMemset(flag, 0, sizeof(int)) == cudaSuccess);
        REQUIRE(dstrain_cuda_unscale_found_inf_f32(dg.ptr, static_cast<size_t>(n), 1.0f / 65536.0f, flag, nullptr) == 0);
        int found = -1;
        REQUIRE(cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
        INFO("n = " << n << ", bad at " << bad_at);
        CHECK(found == (bad_at >= 0 ? 1 : 0));
        const at::Tensor want = g * (1.0f / 65536.0f);  // a power of two: exact
        const at::Tensor got = dg.fetch();
        CHECK(at::equal(got.isfinite(), want.isfinite()));
        CHECK(at::equal(got.masked_select(want.isfinite()), want.masked_select(want.isfinite())));
      }
    }
  }
  // The flag is only ever set: a second, clean buffer leaves a raised flag raised.
  at::Tensor clean = at::ones({10});
  DeviceBuffer dc(clean);
  REQUIRE(cudaMemset(flag, 0, sizeof(int)) == cudaSuccess);
  int one = 1;
  REQUIRE(cudaMemcpy(flag, &one, sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(dstrain_cuda_unscale_found_inf_f32(dc.ptr, 10, 0.5f, flag, nullptr) == 0);
  int found = -1;
  REQUIRE(cudaMemcpy(&found, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(found == 1);
  cudaFree(flag);
}

TEST_CASE("pinned host memory (cudaHostRegister): exactly the size asked for, and asynchronous copies through it are exact", "[gpu]") {
  const int64_t n = (int64_t{1} << 24) + 3;  // the caching host allocator would pin 2x this
  at::Tensor host = dstrain::device::pinned_empty(n, at::kBFloat16, "a test buffer");
  CHECK(host.is_pinned());
  // Exact where this machine lets CUDA register memory (a sandbox may not: ATen's allocator then).
  std::vector<char> probe(1 << 16);
  if (dstrain_cuda_host_register(probe.data(), probe.size()) == 0) {
    dstrain_cuda_host_unregister(probe.data());
    CHECK(host.storage().nbytes() == static_cast<size_t>(2 * n));
  } else {
    WARN("cudaHostRegister is refused here: pinned buffers come from ATen's allocator");
  }
  const at::Tensor source = at::randn({n}, at::TensorOptions().device(at::kCUDA)).to(at::kBFloat16);
  host.copy_(source, /*non_blocking=*/true);
  at::Tensor back = at::empty({n}, source.options());
  back.copy_(host, /*non_blocking=*/true);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(at::equal(back, source));
}
