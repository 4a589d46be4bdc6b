#pragma once
// `dstrain bench optimizer`: the fused CPU Adam against torch::optim::AdamW on the same
// parameters, next to a memory-bandwidth reference kernel with the same traffic (read 4 fp32
// arrays, write 3), all in this process.
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
// The same on the GPU: the fused CUDA kernel, torch::optim::AdamW on CUDA tensors, and a
// device-to-device copy moving the same bytes as the bandwidth reference. Throws
// Error{kEnvironment} without a GPU.
AdamBenchResult bench_adam_cuda(int64_t params, int iters);

}  // namespace dstrain::optim
