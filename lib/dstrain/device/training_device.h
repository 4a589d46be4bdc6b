#pragma once
// The device a worker trains on (DSTRAIN_DEVICE, chosen by the launcher: cuda:<local rank mod
// visible GPUs>, or cpu when no GPU is visible) and what only a GPU has: its datasheet peak for
// MFU, the caching allocator's peaks, and an out-of-memory message that says what to change.
#include <c10/core/Device.h>

#include <string>

#include "dstrain/config/enums.h"

namespace dstrain::config {
struct Recipe;
}

namespace dstrain::device {

struct TrainingDevice {
  c10::Device device = c10::Device(c10::kCPU);
  std::string name;       // "cpu", or the GPU's name ("NVIDIA H200")
  double memory_gib = 0;  // a GPU's total memory (0 on CPU)
};

// Parses and checks "cpu" / "cuda:N"; on a GPU makes it this thread's current device.
// Throws Error{kEnvironment} when the GPU does not exist or dstrain was built without CUDA.
TrainingDevice open_training_device(const std::string& spec, int rank);

// Dense (no sparsity) datasheet peak TFLOP/s of a known GPU for the training dtype (bf16/fp16
// tensor cores; fp32 without TF32, PyTorch's default), or 0 when the GPU is not in the table.
double datasheet_peak_tflops(const std::string& gpu_name, config::Dtype dtype);
// The best throughput (TFLOP/s) of an n x n GEMM in `dtype` on `device`: after a warm-up,
// `rounds` timed rounds of `per_round` matmuls, the device synchronised around each.
double best_gemm_tflops(const c10::Device& device, config::Dtype dtype, int64_t n, int rounds, int per_round);
// MFU's denominator where no datasheet applies. On a GPU outside the table: a 4096^2 GEMM in the
// training dtype (0 without a GPU). On CPU: the best fp32 1024^2 GEMM this process's threads reach.
double measured_gpu_peak_tflops(const c10::Device& device, config::Dtype dtype);
double measured_cpu_peak_tflops();

// The CUDA caching allocator's peak allocated and reserved bytes on `device` since the start, MiB
// (negative on CPU or without CUDA).
struct DeviceMemoryPeaks {
  double allocated_mb = -1, reserved_mb = -1;
};
DeviceMemoryPeaks device_memory_peaks(const c10::Device& device);

// Waits for the device's queued work (a no-op on CPU): step timings must include it.
void synchronize(const c10::Device& device);
// Returns the CUDA caching allocator's unused blocks to the driver (a no-op on CPU): the last
// step of a worker's shutdown, after its tensors are gone.
void release_cached_memory(const c10::Device& device);

// The message for an out-of-memory failure on `device` in `where` ("forward of step 12"): the
// per-rank estimate of model states and activations for this recipe, the device's size, and what
// to change (micro batch, ZeRO stage, offload). `detail` is the allocator's own first line.
std::string out_of_memory_message(const config::Recipe& recipe, const TrainingDevice& device, const std::string& where,
                                  const std::string& detail);
// What to change, the biggest share first (activations or model state).
std::string out_of_memory_hint(const config::Recipe& recipe);

}  // namespace dstrain::device
