#include "dstrain/train/step_profiler.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/log.h"
#include "dstrain/device/training_device.h"

namespace dstrain::train {
namespace {

namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

StepProfileSummary summarize(const kineto::ProfilerResult& result) {
  StepProfileSummary s;
  for (const kineto::KinetoEvent& e : result.events()) {
    const std::string name = e.name();
    if (e.deviceType() == c10::DeviceType::CUDA) {
      if (starts_with(name, "Memcpy") || starts_with(name, "Memset")) {
        ++s.gpu_copies;
      } else {
        ++s.gpu_kernels;
        s.gpu_kernel_ms += static_cast<double>(e.durationNs()) / 1e6;
      }
    } else if (starts_with(name, "cuda") || starts_with(name, "cu")) {  // the CUDA runtime and driver API
      if (name.find("LaunchKernel") != std::string::npos) ++s.launches;
    } else {
      ++s.cpu_ops;
    }
  }
  return s;
}

}  // namespace

std::string StepProfileSummary::line() const {
  return fmt::format("{} CPU ops, {} kernel launches, {} GPU kernels ({:.1f} ms of kernel time), {} GPU copies", cpu_ops, launches,
                     gpu_kernels, gpu_kernel_ms, gpu_copies);
}

StepProfiler::StepProfiler(int64_t step, std::string trace_dir, int rank, c10::Device device)
    : step_(step), trace_dir_(std::move(trace_dir)), rank_(rank), device_(device) {}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    kineto::disableProfiler();
  } catch (...) {  // a destructor on the way out of a failed step: the trace is lost, nothing else
  }
}

void StepProfiler::begin(int64_t step) {
  if (step != step_ || done_ || recording_) return;
  done_ = true;
  // The profiler is a diagnosis: if it cannot start here (no CUPTI, say), training goes on.
  try {
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (device_.is_cuda()) activities.insert(impl::ActivityType::CUDA);
    // Without a GPU, Kineto's own logger reports the missing device as an error: keep it quiet
    // (a user's KINETO_LOG_LEVEL wins).
    if (!device_.is_cuda()) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    kineto::prepareProfiler(config, activities);
    kineto::enableProfiler(config, activities);
    recording_ = true;
  } catch (const std::exception& e) {
    log::warn(fmt::format("logging.profile_step {}: the PyTorch profiler did not start ({}); the step runs unrecorded", step_, e.what()));
  }
}

void StepProfiler::end() {
  if (!recording_) return;
  recording_ = false;
  try {
    device::synchronize(device_);  // the step's kernels finish inside the recording
    const std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
    std::filesystem::create_directories(trace_dir_);
    const std::string path = fmt::format("{}/step_{}_rank_{:05d}.json", trace_dir_, step_, rank_);
    result->save(path + ".tmp");
    rename_atomic(path + ".tmp", path);
    log::info(fmt::format("profile of step {}: {}; trace {}", step_, summarize(*result).line(), path));
  } catch (const std::exception& e) {
    log::warn(fmt::format("logging.profile_step {}: the profile could not be written ({})", step_, e.what()));
  }
}

}  // namespace dstrain::train
