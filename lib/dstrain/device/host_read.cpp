#include "dstrain/device/host_read.h"

#include <ATen/ATen.h>

#include <atomic>

namespace dstrain::device {
namespace {
std::atomic<int64_t> reads{0};
}

std::vector<double> read_to_host(const at::Tensor& values) {
  ++reads;
  const at::Tensor host = values.to(at::kCPU, at::kDouble).contiguous().reshape({-1});
  const double* v = host.data_ptr<double>();
  return std::vector<double>(v, v + host.numel());
}

at::Tensor send_to_device(const std::vector<double>& values, const c10::Device& device) {
  const at::Tensor host = at::tensor(values, at::kDouble);
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);  // the caching host allocator keeps the block until the copy ends
}

int64_t host_reads() { return reads.load(); }

}  // namespace dstrain::device
