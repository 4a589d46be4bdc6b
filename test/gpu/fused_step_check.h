#pragma once
// The fused optimizer step on a device against its CPU twin on the same runs: what gpu.kernels
// checks with the CUDA kernels (cuda/fused_step.cu through optim::FusedStep), and what the CPU
// suite runs with the device being the CPU, so that the checks' plumbing (the fixture, its copies
// to the device, the gap and model-copy masks, the sentinels) cannot reach the GPU broken.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "catch_torch.h"
#include "dstrain/optim/fused_step.h"
#include "fused_step_fixture.h"

namespace dstrain::test {

inline const std::vector<int64_t>& fused_step_sizes() {
  static const std::vector<int64_t> sizes{1, 15, optim::FusedStep::kPieceElements, optim::FusedStep::kPieceElements + 1, 200003, 3000017};
  return sizes;
}

// Largest |got - want| in units of (1e-5 |want| + 1e-7): fp32 rounding (FMA contraction differs
// between the AVX kernel and nvcc's code).
inline double worst_step_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().to(at::kDouble), w = want.cpu().to(at::kDouble);
  return ((g - w).abs() / (w.abs() * 1e-5 + 1e-7)).max().item<double>();
}

// Three Adam steps with gradient scale 0.25 on `device` and on the CPU, `dtype` gradients and model copy.
inline void check_fused_step_against_cpu(const c10::Device& device, at::ScalarType dtype) {
  INFO("dtype " << c10::toString(dtype) << " on " << device);
  StepFixture host = StepFixture::make(dtype, fused_step_sizes(), 21);
  StepFixture dev = host.to(device);
  const at::Tensor master_before = host.master.clone();
  optim::FusedStep cpu_step(at::kCPU, dtype, host.runs());
  optim::FusedStep dev_step(device, dtype, dev.runs());
  CHECK(dev_step.pieces() == cpu_step.pieces());

  const double cpu_sq = cpu_step.grad_sum_squares(), dev_sq = dev_step.grad_sum_squares();
  CHECK(dev_sq == Approx(cpu_sq).epsilon(1e-12));
  CHECK(dev_step.grad_sum_squares() == dev_sq);  // the same additions in the same order

  optim::AdamHyper h;
  h.lr = 2e-3, h.beta1 = 0.9, h.beta2 = 0.95, h.weight_decay = 0.1, h.step = 5;
  for (int i = 0; i < 3; ++i, ++h.step) {
    cpu_step.apply(h, 0.25f);
    dev_step.apply(h, 0.25f);
  }
  CHECK(worst_step_error(dev.master, host.master) <= 1.0);
  CHECK(worst_step_error(dev.exp_avg, host.exp_avg) <= 1.0);
  CHECK(worst_step_error(dev.exp_avg_sq, host.exp_avg_sq) <= 1.0);
  CHECK_FALSE(at::equal(host.master, master_before));  // the step moved the weights
  const at::Tensor gaps = host.run_mask().logical_not();
  CHECK(at::equal(dev.master.cpu().masked_select(gaps), master_before.masked_select(gaps)));
  // The model copy: the device's own master rounded exactly as ATen rounds; untouched elsewhere.
  const at::Tensor with_out = host.out_mask();
  const at::Tensor out = dev.out.cpu();
  CHECK(at::equal(out.masked_select(with_out), dev.master.to(dtype).cpu().masked_select(with_out)));
  CHECK((out.masked_select(with_out.logical_not()).to(at::kFloat) == StepFixture::kSentinel).all().item<bool>());
}

// An inf gradient shows in the norm, with and without fp32 state; no runs is no work.
inline void check_fused_step_overflow(const c10::Device& device) {
  StepFixture host = StepFixture::make(at::kHalf, fused_step_sizes(), 5);
  host.grad[host.offsets[4] + 70000] = std::numeric_limits<float>::infinity();
  StepFixture dev = host.to(device);
  CHECK(std::isinf(optim::FusedStep(device, at::kHalf, dev.runs()).grad_sum_squares()));
  // Runs without fp32 state (the offloaded update only asks for the norm).
  std::vector<optim::StepRun> norm_only = dev.runs();
  for (auto& r : norm_only) r.master = r.exp_avg = r.exp_avg_sq = nullptr, r.param_out = nullptr;
  CHECK(std::isinf(optim::FusedStep(device, at::kHalf, norm_only).grad_sum_squares()));
  const optim::FusedStep none(device, at::kBFloat16, {});
  CHECK(none.grad_sum_squares() == 0.0);
  none.apply(optim::AdamHyper{}, 1.0f);
}

}  // namespace dstrain::test
