#pragma once
// The optimizer step over flat buffers: the gradient norm's sum of squares and the fused Adam
// update of every parameter run in one pass each, reading the gradients in the model dtype (no
// fp32 copy of them) and writing the updated parameters' model-dtype copy in the same pass.
// On a GPU each phase is one launch over a table of pieces (cuda/fused_step.cu); on the CPU the
// same runs go through the fused CPU Adam (cpu_adam.h), which makes this the CPU twin the GPU
// kernels are tested against.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dstrain/optim/cpu_adam.h"

namespace dstrain::optim {

// One parameter's elements in a rank's shard: its fp32 master weights and Adam moments, its
// gradient (`grad_dtype` of the step) and where the model-dtype copy goes (nullptr: nowhere).
// All pointers are on the step's device.
struct StepRun {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  void* param_out = nullptr;
  int64_t n = 0;
  bool decay = true;  // weight decay applies
};

// The CPU kernel's name for a step dtype (float, bfloat16 or half; Error{kConfig} otherwise).
AdamElem adam_elem(c10::ScalarType t);

class FusedStep {
 public:
  // grad_dtype: float, bfloat16 or half (gradients and the model copy). The runs' pointers must
  // stay valid while this object is used. Throws Error{kConfig} for another dtype and
  // Error{kEnvironment} for a GPU in a build without CUDA.
  FusedStep(c10::Device device, c10::ScalarType grad_dtype, std::vector<StepRun> runs);
  ~FusedStep();
  FusedStep(const FusedStep&) = delete;
  FusedStep& operator=(const FusedStep&) = delete;

  // Sum of the squared gradients as stored, accumulated in double (inf/nan when any is).
  // Waits for the device.
  double grad_sum_squares() const;
  // The same as a float64 scalar on the runs' device, without waiting (the GPU's is overwritten
  // by the next call: use it before).
  at::Tensor grad_sum_squares_tensor() const;
  // Adam on every run (no weight decay where a run does not decay), gradients multiplied by
  // grad_scale, and the model-dtype copy written where a run has one. Queued on the device.
  void apply(const AdamHyper& h, float grad_scale) const;
  // The model-dtype copies from the master weights alone (after a checkpoint is loaded).
  void write_params() const;

  const std::vector<StepRun>& runs() const { return runs_; }
  // Thread blocks one GPU phase launches (pieces of at most kPieceElements).
  int64_t pieces() const;
  static constexpr int64_t kPieceElements = int64_t{1} << 16;

 private:
  struct Device;
  c10::Device device_;
  c10::ScalarType dtype_;
  std::vector<StepRun> runs_;
  std::unique_ptr<Device> gpu_;  // the piece table on the GPU; null on the CPU
};

}  // namespace dstrain::optim
