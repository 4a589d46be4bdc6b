#pragma once
// `dstrain bench optimizer`: the fused CPU Adam against torch::optim::AdamW on the same
// parameters, next to a memory-bandwidth reference kernel with the same traffic (read 4 fp32
// arrays, write 3), all in this process.
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace dstrain::optim {

struct AdamBenchResult {
  int64_t params = 0;
  int threads = 1;
  std::string isa;
  double fused_ms = 0, torch_ms = 0, bandwidth_ms = 0;  // median per step
  double fused_params_per_s() const { return static_cast<double>(params) / (fused_ms / 1e3); }
  double torch_params_per_s() const { return static_cast<double>(params) / (torch_ms / 1e3); }
  // Bytes a step moves: p, g, m, v read (16 B) and p, m, v written (12 B) per parameter.
  double bytes() const { return 28.0 * static_cast<double>(params); }
  double fused_gb_per_s() const { return bytes() / (fused_ms / 1e3) / 1e9; }
  double bandwidth_gb_per_s() const { return bytes() / (bandwidth_ms / 1e3) / 1e9; }
};

AdamBenchResult bench_adam(int64_t params, int threads, int iters);
// The bandwidth reference on the CPU: Adam's traffic over four fp32 arrays (read p, g, m, v;
// write p, m, v) with the least arithmetic that keeps every stream live, on every thread.
void bandwidth_reference(float* p, const float* g, float* m, float* v, int64_t n);
// The same on the GPU: the fused CUDA kernel, torch::optim::AdamW on CUDA tensors, and a
// device-to-device copy moving the same bytes as the bandwidth reference. Throws
// Error{kEnvironment} without a GPU.
AdamBenchResult bench_adam_cuda(int64_t params, int iters);

// The optimizer phase of a bf16 model as the ZeRO engine runs it (issue 21), over runs shaped
// like a model's (4M-element matrices with a 2K-element norm after each): the fused step
// (FusedStep: the norm from the bf16 gradients, then one Adam pass that writes the bf16 copy)
// against the engine's previous way, in the same process: an fp32 copy of the gradients, the
// norm in 1M-element chunks, Adam per run, then the bf16 copy.
struct StepBenchResult {
  int64_t params = 0;
  int64_t runs = 0;
  double fused_ms = 0, previous_ms = 0;  // median per step
  double norm_ms = 0, update_ms = 0;     // the fused step's two phases alone (medians)
  // CPU: the bandwidth reference over as many fp32 parameters, timed alternately with the update
  // (the same moments of a shared machine's noise); 0 on a GPU.
  double reference_ms = 0;
  // What the fused step must move per parameter: the bf16 gradient read twice (norm, update),
  // master, m and v read and written, the bf16 copy written: 30 bytes.
  double bytes() const { return 30.0 * static_cast<double>(params); }
  double fused_gb_per_s() const { return bytes() / (fused_ms / 1e3) / 1e9; }
};
StepBenchResult bench_optimizer_step(c10::Device device, int64_t params, int iters);

}  // namespace dstrain::optim
