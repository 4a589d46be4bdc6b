#pragma once
// Flat buffers for optim::FusedStep tests (CPU unit tests and the GPU kernel tests): runs of
// awkward sizes (1 element, a piece boundary, several pieces) laid out with gaps between them,
// alternating weight decay, some without a model-dtype copy. The gaps hold a sentinel that no
// step may touch.
#include <ATen/ATen.h>

#include <vector>

#include "dstrain/optim/fused_step.h"

namespace dstrain::test {

struct StepFixture {
  static constexpr int64_t kGap = 37;
  static constexpr float kSentinel = 7.0f;
  at::Tensor master, exp_avg, exp_avg_sq;  // fp32
  at::Tensor grad, out;                    // the model dtype
  std::vector<int64_t> offsets, sizes;
  std::vector<bool> decay, has_out;

  static StepFixture make(at::ScalarType dtype, const std::vector<int64_t>& sizes, uint64_t seed) {
    StepFixture f;
    int64_t total = kGap;
    for (size_t i = 0; i < sizes.size(); ++i) {
      f.offsets.push_back(total);
      f.sizes.push_back(sizes[i]);
      f.decay.push_back(i % 2 == 0);
      f.has_out.push_back(i % 3 != 2);
      total += sizes[i] + kGap;
    }
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const auto fp32 = at::TensorOptions().dtype(at::kFloat);
    f.master = at::randn({total}, gen, fp32);
    f.exp_avg = at::randn({total}, gen, fp32) * 1e-2;
    f.exp_avg_sq = at::rand({total}, gen, fp32) * 1e-3;
    f.grad = (at::randn({total}, gen, fp32) * 1e-1).to(dtype);
    f.out = at::full({total}, kSentinel, fp32).to(dtype);
    return f;
  }

  StepFixture to(const c10::Device& device) const {
    StepFixture f = *this;
    for (at::Tensor* t : {&f.master, &f.exp_avg, &f.exp_avg_sq, &f.grad, &f.out}) *t = t->to(device, /*non_blocking=*/false, /*copy=*/true);
    return f;
  }

  std::vector<optim::StepRun> runs() {
    std::vector<optim::StepRun> out_runs;
    const int64_t esz = grad.element_size();
    for (size_t i = 0; i < sizes.size(); ++i) {
      optim::StepRun r;
      r.master = master.data_ptr<float>() + offsets[i];
      r.exp_avg = exp_avg.data_ptr<float>() + offsets[i];
      r.exp_avg_sq = exp_avg_sq.data_ptr<float>() + offsets[i];
      r.grad = static_cast<const char*>(grad.data_ptr()) + offsets[i] * esz;
      r.param_out = has_out[i] ? static_cast<char*>(out.data_ptr()) + offsets[i] * esz : nullptr;
      r.n = sizes[i];
      r.decay = decay[i];
      out_runs.push_back(r);
    }
    return out_runs;
  }

  // The elements that belong to runs (1) and the gaps (0).
  at::Tensor run_mask() const {
    at::Tensor mask = at::zeros({master.numel()}, at::kBool);
    for (size_t i = 0; i < sizes.size(); ++i) mask.narrow(0, offsets[i], sizes[i]).fill_(true);
    return mask;
  }
  // The elements of runs with a model-dtype copy.
  at::Tensor out_mask() const {
    at::Tensor mask = at::zeros({master.numel()}, at::kBool);
    for (size_t i = 0; i < sizes.size(); ++i)
      if (has_out[i]) mask.narrow(0, offsets[i], sizes[i]).fill_(true);
    return mask;
  }
};

}  // namespace dstrain::test
