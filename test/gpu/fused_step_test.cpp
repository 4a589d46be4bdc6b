// The fused optimizer step's CUDA kernels (cuda/fused_step.cu through optim::FusedStep) against
// its CPU twin on the same runs: fp32, bf16 and fp16 gradients, awkward run sizes, gaps that
// must stay untouched, a deterministic norm, and the model-dtype copy rounded as ATen rounds.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "dstrain/optim/fused_step.h"
#include "fused_step_fixture.h"

using dstrain::optim::AdamHyper;
using dstrain::optim::FusedStep;
using dstrain::test::StepFixture;

namespace {

const std::vector<int64_t> kSizes{1, 15, FusedStep::kPieceElements, FusedStep::kPieceElements + 1, 200003, 3000017};

// Largest |got - want| in units of (1e-5 |want| + 1e-7): fp32 rounding (FMA contraction differs
// between the AVX kernel and nvcc's code).
double worst_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().to(at::kDouble), w = want.cpu().to(at::kDouble);
  return ((g - w).abs() / (w.abs() * 1e-5 + 1e-7)).max().item<double>();
}

}  // namespace

TEST_CASE("fused step on the GPU matches its CPU twin in fp32, bf16 and fp16", "[gpu]") {
  const c10::Device cuda(c10::kCUDA, 0);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    INFO("dtype " << c10::toString(dtype));
    StepFixture host = StepFixture::make(dtype, kSizes, 21);
    StepFixture dev = host.to(cuda);
    const at::Tensor master_before = host.master.clone();
    FusedStep cpu_step(at::kCPU, dtype, host.runs());
    FusedStep gpu_step(cuda, dtype, dev.runs());
    CHECK(gpu_step.pieces() == cpu_step.pieces());

    const double cpu_sq = cpu_step.grad_sum_squares(), gpu_sq = gpu_step.grad_sum_squares();
    CHECK(gpu_sq == Approx(cpu_sq).epsilon(1e-12));
    CHECK(gpu_step.grad_sum_squares() == gpu_sq);  // the same additions in the same order

    AdamHyper h;
    h.lr = 2e-3, h.beta1 = 0.9, h.beta2 = 0.95, h.weight_decay = 0.1, h.step = 5;
    for (int i = 0; i < 3; ++i, ++h.step) {
      cpu_step.apply(h, 0.25f);
      gpu_step.apply(h, 0.25f);
    }
    CHECK(worst_error(dev.master, host.master) <= 1.0);
    CHECK(worst_error(dev.exp_avg, host.exp_avg) <= 1.0);
    CHECK(worst_error(dev.exp_avg_sq, host.exp_avg_sq) <= 1.0);
    const at::Tensor gaps = host.run_mask().logical_not();
    CHECK(at::equal(dev.master.cpu().masked_select(gaps), master_before.masked_select(gaps)));
    // The model copy: the GPU's own master rounded exactly as ATen rounds; untouched elsewhere.
    const at::Tensor with_out = host.out_mask();
    const at::Tensor out = dev.out.cpu();
    CHECK(at::equal(out.masked_select(with_out), dev.master.to(dtype).cpu().masked_select(with_out)));
    CHECK((out.masked_select(with_out.logical_not()).to(at::kFloat) == StepFixture::kSentinel).all().item<bool>());
  }
}

TEST_CASE("fused step on the GPU: overflow shows in the norm; no runs is no work", "[gpu]") {
  const c10::Device cuda(c10::kCUDA, 0);
  StepFixture host = StepFixture::make(at::kHalf, kSizes, 5);
  host.grad[host.offsets[4] + 70000] = std::numeric_limits<float>::infinity();
  StepFixture dev = host.to(cuda);
  CHECK(std::isinf(FusedStep(cuda, at::kHalf, dev.runs()).grad_sum_squares()));
  // Runs without fp32 state (the offloaded update only asks for the norm).
  std::vector<dstrain::optim::StepRun> norm_only = dev.runs();
  for (auto& r : norm_only) r.master = r.exp_avg = r.exp_avg_sq = nullptr, r.param_out = nullptr;
  CHECK(std::isinf(FusedStep(cuda, at::kHalf, norm_only).grad_sum_squares()));
  const FusedStep none(cuda, at::kBFloat16, {});
  CHECK(none.grad_sum_squares() == 0.0);
  none.apply(AdamHyper{}, 1.0f);
}
