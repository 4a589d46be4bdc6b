// optim::FusedStep on the CPU (the twin the GPU kernels are tested against): the gradient norm
// and the Adam update over runs of flat buffers, in fp32, bf16 and fp16, against per-run
// references; the model-dtype copy; gaps between runs untouched.
#include "catch_torch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "dstrain/core/error.h"
#include "dstrain/optim/fused_step.h"
#include "fused_step_fixture.h"

using dstrain::optim::AdamHyper;
using dstrain::optim::FusedStep;
using dstrain::test::StepFixture;

namespace {

const std::vector<int64_t> kSizes{1, 15, FusedStep::kPieceElements, FusedStep::kPieceElements + 1, 200003};

// Largest |got - want| in units of (1e-5 |want| + 1e-7): fp32 rounding, as in cpu_adam_test.
double worst_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).abs() / (w.abs() * 1e-5 + 1e-7)).max().item<double>();
}

}  // namespace

TEST_CASE("fused step: norm and update over runs match per-run references in fp32, bf16 and fp16", "[optim]") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    INFO("dtype " << c10::toString(dtype));
    StepFixture f = StepFixture::make(dtype, kSizes, 7);
    StepFixture ref = f.to(at::kCPU);
    const at::Tensor in_runs = f.run_mask();
    FusedStep step(at::kCPU, dtype, f.runs());
    CHECK(step.pieces() == 1 + 1 + 1 + 2 + 4);

    const double want_sq = f.grad.to(at::kDouble).masked_select(in_runs).pow(2).sum().item<double>();
    CHECK(step.grad_sum_squares() == Approx(want_sq).epsilon(1e-12));

    AdamHyper h;
    h.lr = 1e-3, h.beta1 = 0.9, h.beta2 = 0.95, h.weight_decay = 0.1, h.step = 3;
    step.apply(h, 0.5f);
    for (size_t i = 0; i < ref.sizes.size(); ++i) {
      AdamHyper hr = h;
      if (!ref.decay[i]) hr.weight_decay = 0;
      const int64_t at = ref.offsets[i], n = ref.sizes[i];
      at::Tensor g = ref.grad.narrow(0, at, n).to(at::kFloat).contiguous();
      dstrain::optim::reference_adam(ref.master.data_ptr<float>() + at, g.data_ptr<float>(), ref.exp_avg.data_ptr<float>() + at,
                                     ref.exp_avg_sq.data_ptr<float>() + at, n, hr, 0.5f);
    }
    CHECK(worst_error(f.master, ref.master) <= 1.0);
    CHECK(worst_error(f.exp_avg, ref.exp_avg) <= 1.0);
    CHECK(worst_error(f.exp_avg_sq, ref.exp_avg_sq) <= 1.0);
    // Gaps: bit for bit what they were (the reference never touches them).
    const at::Tensor gaps = in_runs.logical_not();
    CHECK(at::equal(f.master.masked_select(gaps), ref.master.masked_select(gaps)));
    CHECK(at::equal(f.exp_avg_sq.masked_select(gaps), ref.exp_avg_sq.masked_select(gaps)));
    // The model copy: exactly the new master in the model dtype where a run has one; else untouched.
    const at::Tensor with_out = f.out_mask();
    CHECK(at::equal(f.out.masked_select(with_out), f.master.to(dtype).masked_select(with_out)));
    CHECK((f.out.masked_select(with_out.logical_not()).to(at::kFloat) == StepFixture::kSentinel).all().item<bool>());
  }
}

TEST_CASE("fused step: write_params converts the master weights alone", "[optim]") {
  StepFixture f = StepFixture::make(at::kBFloat16, kSizes, 11);
  FusedStep step(at::kCPU, at::kBFloat16, f.runs());
  f.master.mul_(3);
  step.write_params();
  const at::Tensor with_out = f.out_mask();
  CHECK(at::equal(f.out.masked_select(with_out), f.master.to(at::kBFloat16).masked_select(with_out)));
  CHECK((f.out.masked_select(with_out.logical_not()).to(at::kFloat) == StepFixture::kSentinel).all().item<bool>());
}

TEST_CASE("fused step: an inf or nan gradient makes the norm non-finite; other dtypes are refused", "[optim]") {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    StepFixture f = StepFixture::make(at::kHalf, kSizes, 3);
    f.grad[f.offsets[3] + FusedStep::kPieceElements] = bad;  // the second piece of a run
    FusedStep step(at::kCPU, at::kHalf, f.runs());
    CHECK_FALSE(std::isfinite(step.grad_sum_squares()));
  }
  StepFixture f = StepFixture::make(at::kFloat, kSizes, 3);
  f.grad.narrow(0, 0, StepFixture::kGap).fill_(std::numeric_limits<float>::infinity());  // a gap: not part of any run
  CHECK(std::isfinite(FusedStep(at::kCPU, at::kFloat, f.runs()).grad_sum_squares()));
  try {
    FusedStep(at::kCPU, at::kDouble, f.runs());
    FAIL("a double step was accepted");
  } catch (const dstrain::Error& e) {
    CHECK(e.code() == dstrain::ErrorCode::kConfig);
    CHECK_THAT(e.what(), Catch::Contains("Double"));
  }
}
