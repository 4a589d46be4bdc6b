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

int64_t host_reads() { return reads.load(); }

}  // namespace dstrain::device
