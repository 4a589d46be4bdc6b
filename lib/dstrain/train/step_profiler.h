#pragma once
// logging.profile_step: one step recorded with the PyTorch profiler (Kineto), to see where a
// step's time goes op by op: the CPU's ATen ops and CUDA API calls and, on a GPU, every kernel
// and copy (CUPTI). Each rank writes a Chrome trace, run_dir/profile/step_<N>_rank_<RRRRR>.json
// (Perfetto or chrome://tracing opens it), and logs what the step ran: CPU ops, kernel launches,
// GPU kernels and their summed time. The recorded step runs slower than the others.
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace dstrain::train {

struct StepProfileSummary {
  int64_t cpu_ops = 0;       // ATen ops and other CPU events the profiler recorded
  int64_t launches = 0;      // CUDA launch API calls (cudaLaunchKernel and the like)
  int64_t gpu_kernels = 0;   // kernels that ran on the GPU
  int64_t gpu_copies = 0;    // memcpy and memset on the GPU
  double gpu_kernel_ms = 0;  // their summed duration
  std::string line() const;  // the log line's numbers
};

class StepProfiler {
 public:
  // step: the 1-based step to record (0: none). trace_dir: where the traces go.
  StepProfiler(int64_t step, std::string trace_dir, int rank, c10::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each step (1-based): records the chosen one, once (a rolled-back step is not
  // recorded twice). end() waits for the GPU, writes the trace and logs the summary.
  void begin(int64_t step);
  void end();

 private:
  int64_t step_;
  std::string trace_dir_;
  int rank_;
  c10::Device device_;
  bool recording_ = false;
  bool done_ = false;
};

}  // namespace dstrain::train
