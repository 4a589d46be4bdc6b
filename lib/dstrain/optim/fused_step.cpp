#include "dstrain/optim/fused_step.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <string>

#include "dstrain/core/cuda_elem.h"
#include "dstrain/core/error.h"
#include "dstrain_cuda.h"

#ifdef DSTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dstrain::optim {
namespace {

int elem_code(c10::ScalarType t) {
  const int code = cuda_elem_code(t);
  if (code < 0)
    throw Error(ErrorCode::kConfig,
                std::string("the fused optimizer step reads float, bfloat16 or half gradients, not ") + c10::toString(t),
                "train in fp32, bf16 or fp16");
  return code;
}

// A run's piece: [offset, offset + n) of run `run`.
struct Piece {
  size_t run;
  int64_t offset, n;
};

std::vector<Piece> pieces_of(const std::vector<StepRun>& runs) {
  std::vector<Piece> out;
  for (size_t r = 0; r < runs.size(); ++r)
    for (int64_t at = 0; at < runs[r].n; at += FusedStep::kPieceElements)
      out.push_back({r, at, std::min(FusedStep::kPieceElements, runs[r].n - at)});
  return out;
}

at::Tensor view_of(void* data, int64_t n, c10::ScalarType t, c10::Device device) {
  return at::from_blob(data, {n}, at::TensorOptions().dtype(t).device(device));
}

// The run's model-dtype weights from its fp32 master (one rounding to nearest even).
void write_param_of(const StepRun& r, c10::ScalarType dtype, c10::Device device) {
  if (r.param_out) view_of(r.param_out, r.n, dtype, device).copy_(view_of(r.master, r.n, at::kFloat, device));
}

}  // namespace

AdamElem adam_elem(c10::ScalarType t) {
  elem_code(t);
  return t == c10::ScalarType::BFloat16 ? AdamElem::kBFloat16 : t == c10::ScalarType::Half ? AdamElem::kHalf : AdamElem::kFloat;
}

struct FusedStep::Device {
  at::Tensor table;     // DstrainStepPiece[pieces], on the GPU
  at::Tensor partials;  // double[pieces]
  at::Tensor total;     // double
  int pieces = 0;
};

FusedStep::FusedStep(c10::Device device, c10::ScalarType grad_dtype, std::vector<StepRun> runs)
    : device_(device), dtype_(grad_dtype), runs_(std::move(runs)) {
  elem_code(grad_dtype);
  if (device.is_cpu()) return;
  if (!device.is_cuda() || !dstrain_cuda_built())
    throw Error(ErrorCode::kEnvironment, "the optimizer state is on " + device.str() + " but this dstrain was built without CUDA",
                "build dstrain with DSTRAIN_CUDA=ON on a machine with nvcc, NCCL and a CUDA LibTorch");
  std::vector<DstrainStepPiece> table;
  for (const Piece& p : pieces_of(runs_)) {
    const StepRun& r = runs_[p.run];
    const int64_t esz = c10::elementSize(dtype_);
    // Runs without fp32 state (an offloaded update: only the norm is computed here) keep nulls.
    const auto at = [&](float* x) { return x ? x + p.offset : nullptr; };
    table.push_back({at(r.master), at(r.exp_avg), at(r.exp_avg_sq), static_cast<const char*>(r.grad) + p.offset * esz,
                     r.param_out ? static_cast<char*>(r.param_out) + p.offset * esz : nullptr, p.n, r.decay ? 1 : 0, 0});
  }
  if (table.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw Error(ErrorCode::kConfig, "the optimizer shard has more pieces than one kernel launch can cover", "raise the world size");
  gpu_ = std::make_unique<Device>();
  gpu_->pieces = static_cast<int>(table.size());
  const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(DstrainStepPiece));
  gpu_->table = at::from_blob(table.data(), {bytes}, at::kByte).to(device);  // a blocking copy: `table` may go
  gpu_->partials = at::zeros({std::max<int64_t>(1, gpu_->pieces)}, at::TensorOptions().dtype(at::kDouble).device(device));
  gpu_->total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
}

FusedStep::~FusedStep() = default;

int64_t FusedStep::pieces() const {
  int64_t n = 0;
  for (const StepRun& r : runs_) n += (r.n + kPieceElements - 1) / kPieceElements;
  return n;
}

#ifdef DSTRAIN_WITH_CUDA
namespace {
void check_launch(int rc, const char* what) {
  if (rc != 0)
    throw Error(ErrorCode::kInternal, std::string("the CUDA ") + what + " kernel failed to launch: " + dstrain_cuda_error_string(rc),
                "check the GPU with nvidia-smi and `dstrain check-env`; this may be a dstrain bug");
}
}  // namespace
#endif

double FusedStep::grad_sum_squares() const { return grad_sum_squares_tensor().item<double>(); }

at::Tensor FusedStep::grad_sum_squares_tensor() const {
  if (gpu_) {
#ifdef DSTRAIN_WITH_CUDA
    const c10::cuda::CUDAGuard guard(device_);
    check_launch(dstrain_cuda_step_sum_squares(static_cast<const DstrainStepPiece*>(gpu_->table.data_ptr()), gpu_->pieces,
                                               elem_code(dtype_), gpu_->partials.data_ptr<double>(), gpu_->total.data_ptr<double>(),
                                               c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
                 "gradient norm");
    return gpu_->total;
#endif
  }
  // Per piece in parallel, then summed in piece order: the same total for any thread count.
  const AdamElem elem = adam_elem(dtype_);
  const std::vector<Piece> pieces = pieces_of(runs_);
  std::vector<double> partial(pieces.size());
  const int64_t esz = c10::elementSize(dtype_);
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Piece& p = pieces[static_cast<size_t>(i)];
      partial[static_cast<size_t>(i)] = sum_squares(static_cast<const char*>(runs_[p.run].grad) + p.offset * esz, elem, p.n);
    }
  });
  double total = 0;
  for (double x : partial) total += x;
  return at::scalar_tensor(total, at::kDouble);
}

void FusedStep::apply(const AdamHyper& h, float grad_scale) const {
  if (gpu_) {
#ifdef DSTRAIN_WITH_CUDA
    const c10::cuda::CUDAGuard guard(device_);
    const DstrainAdamParams params{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.adamw ? 1 : 0, static_cast<long long>(h.step)};
    check_launch(dstrain_cuda_step_adam(static_cast<const DstrainStepPiece*>(gpu_->table.data_ptr()), gpu_->pieces, elem_code(dtype_),
                                        &params, grad_scale, c10::cuda::getCurrentCUDAStream(device_.index()).stream()),
                 "Adam");
    return;
#endif
  }
  // One pass per run: the model-dtype gradients widened and the model-dtype copy written in the kernel.
  const AdamElem elem = adam_elem(dtype_);
  for (const StepRun& r : runs_) {
    AdamHyper hr = h;
    if (!r.decay) hr.weight_decay = 0;
    fused_adam_mixed(r.master, r.grad, r.exp_avg, r.exp_avg_sq, r.param_out, elem, r.n, hr, grad_scale);
  }
}

void FusedStep::write_params() const {
  for (const StepRun& r : runs_) write_param_of(r, dtype_, device_);
}

}  // namespace dstrain::optim
