#include "dstrain/device/training_device.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/core/error.h"
#include "dstrain_cuda.h"

#ifdef DSTRAIN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dstrain::device {

TrainingDevice open_training_device(const std::string& spec, int rank) {
  TrainingDevice out;
  if (spec == "cpu" || spec.empty()) {
    out.name = "cpu";
    return out;
  }
  int index = -1;
  if (spec.rfind("cuda:", 0) == 0) index = std::atoi(spec.c_str() + 5);
  if (index < 0 || spec.find_first_not_of("0123456789", 5) != std::string::npos)
    throw Error(ErrorCode::kEnvironment, fmt::format("rank {}: DSTRAIN_DEVICE='{}' is neither cpu nor cuda:<index>", rank, spec),
                "leave DSTRAIN_DEVICE to the dstrain launcher");
  if (!dstrain_cuda_built())
    throw Error(ErrorCode::kEnvironment, fmt::format("rank {} was given {} but this dstrain was built without CUDA", rank, spec),
                "build with DSTRAIN_CUDA=ON (nvcc, NCCL and a CUDA LibTorch), or hide the GPUs with CUDA_VISIBLE_DEVICES= to train on CPU");
  const int count = dstrain_cuda_device_count();
  if (index >= count)
    throw Error(ErrorCode::kEnvironment, fmt::format("rank {} was given {} but only {} GPU(s) are visible", rank, spec, count),
                "start at most one rank per GPU (--nproc-per-node), check CUDA_VISIBLE_DEVICES and nvidia-smi, or hide the GPUs with "
                "CUDA_VISIBLE_DEVICES= to train on CPU");
  out.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  char name[256] = {0};
  if (dstrain_cuda_device_name(index, name, sizeof name) == 0) out.name = name;
  int major = 0, minor = 0;
  size_t total = 0;
  if (dstrain_cuda_device_props(index, &major, &minor, &total) == 0) out.memory_gib = static_cast<double>(total) / 1073741824.0;
#ifdef DSTRAIN_WITH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#endif
  return out;
}

double datasheet_peak_tflops(const std::string& gpu_name, config::Dtype dtype) {
  // NVIDIA datasheets, dense: {name fragment, bf16/fp16 tensor core, fp32}. Order matters: the
  // first fragment found wins (the PCIe/NVL variants before their SXM names).
  struct Row {
    const char* fragment;
    double half, fp32;
  };
  static const Row rows[] = {
      {"H100 PCIe", 756.5, 51.2}, {"H100 NVL", 835.5, 60.0}, {"H200 NVL", 835.5, 60.0}, {"H100", 989.4, 66.9},
      {"H200", 989.4, 66.9},      {"H800", 989.4, 66.9},     {"H20", 148.0, 44.0},      {"B200", 2250.0, 80.0},
      {"A100", 312.0, 19.5},      {"A800", 312.0, 19.5},     {"L40S", 362.1, 91.6},     {"L40", 181.0, 90.5},
      {"A10G", 70.0, 31.2},       {"A10", 125.0, 31.2},      {"L4", 121.0, 30.3},       {"V100", 125.0, 15.7},
  };
  for (const Row& r : rows)
    if (gpu_name.find(r.fragment) != std::string::npos) return dtype == config::Dtype::kFp32 ? r.fp32 : r.half;
  return 0;
}

double best_gemm_tflops(const c10::Device& device, config::Dtype dtype, int64_t n, int rounds, int per_round) {
  const auto type = model::scalar_type(dtype);
  const at::Tensor a = at::randn({n, n}, at::TensorOptions().device(device).dtype(type)), b = at::randn({n, n}, a.options());
  at::mm(a, b);
  synchronize(device);
  double best = 0;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per_round; ++i) at::mm(a, b);
    synchronize(device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, per_round * 2.0 * n * n * n / s / 1e12);
  }
  return best;
}

double measured_gpu_peak_tflops(const c10::Device& device, config::Dtype dtype) {
  return device.is_cuda() ? best_gemm_tflops(device, dtype, 4096, 5, 4) : 0;
}

double measured_cpu_peak_tflops() { return best_gemm_tflops(c10::Device(c10::kCPU), config::Dtype::kFp32, 1024, 3, 1); }

DeviceMemoryPeaks device_memory_peaks(const c10::Device& device) {
  DeviceMemoryPeaks out;
#ifdef DSTRAIN_WITH_CUDA
  if (device.is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
    out.allocated_mb = static_cast<double>(stats.allocated_bytes[aggregate].peak) / 1048576.0;
    out.reserved_mb = static_cast<double>(stats.reserved_bytes[aggregate].peak) / 1048576.0;
  }
#else
  (void)device;
#endif
  return out;
}

void synchronize(const c10::Device& device) {
#ifdef DSTRAIN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

void release_cached_memory(const c10::Device& device) {
#ifdef DSTRAIN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

std::string out_of_memory_hint(const config::Recipe& r) {
  std::string batch =
      fmt::format("lower train.micro_batch_size (now {}; more gradient accumulation keeps the global batch) or data.seq_len (now {})",
                  r.train.micro_batch_size, r.data.seq_len);
  if (r.train.activation_checkpointing != config::Recompute::kFull)
    batch += fmt::format(", or set train.activation_checkpointing: full (now {}; one more forward per step)",
                         config::name(r.train.activation_checkpointing));
  std::vector<std::string> state;
  if (r.zero.stage < 3) state.push_back(fmt::format("raise zero.stage (now {})", r.zero.stage));
  if (r.zero.offload_optimizer != config::OffloadDevice::kCpu)
    state.push_back("set zero.offload_optimizer: cpu (master weights and Adam states in host memory)");
  std::string hint;
  if (cost::activation_bytes_estimate(r) >= cost::model_state_memory(r).device_bytes || state.empty()) {
    hint = batch + " first: activations are most of it";
    if (!state.empty()) hint += "; then " + state[0] + (state.size() > 1 ? " or " + state[1] : "");
  } else {
    hint = state[0] + (state.size() > 1 ? " or " + state[1] : "") + " first: the model state is most of it; or " + batch;
  }
  return hint + "; `dstrain train --dry-run` prints both estimates";
}

std::string out_of_memory_message(const config::Recipe& r, const TrainingDevice& d, const std::string& where, const std::string& detail) {
  const cost::ModelStateMemory state = cost::model_state_memory(r);
  const double gib = 1073741824.0;
  const double activations = cost::activation_bytes_estimate(r);
  const std::string size = d.device.is_cuda() ? fmt::format(" ({}, {:.1f} GiB)", d.name, d.memory_gib) : "";
  return fmt::format(
      "out of memory on {}{} in {}: {}. Per rank this run needs about {:.2f} GiB of model state {} (ZeRO stage {}, {}{}) "
      "plus ~{:.2f} GiB of activations for a micro-batch of {} x {} tokens",
      d.device.str(), size, where, detail, state.device_bytes / gib, d.device.is_cuda() ? "on the GPU" : "in memory", r.zero.stage,
      config::name(r.precision.dtype),
      state.host_bytes > 0 ? fmt::format(", {:.2f} GiB offloaded to host memory", state.host_bytes / gib) : "", activations / gib,
      r.train.micro_batch_size, r.data.seq_len);
}

}  // namespace dstrain::device
