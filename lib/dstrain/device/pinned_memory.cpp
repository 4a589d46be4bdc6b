#include "dstrain/device/pinned_memory.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>

#include "dstrain/config/describe.h"
#include "dstrain/core/error.h"
#include "dstrain_cuda.h"

namespace dstrain::device {

at::Tensor pinned_empty(int64_t numel, at::ScalarType dtype, const std::string& what) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 1)) * at::elementSize(dtype);
  const size_t rounded = (bytes + page - 1) / page * page;
  const std::string size = config::bytes_text(static_cast<double>(rounded));
  void* p = nullptr;
  if (posix_memalign(&p, page, rounded) != 0)
    throw Error(ErrorCode::kEnvironment, fmt::format("could not allocate {} of host memory for {}", size, what),
                "free host memory, use more ranks (the shard shrinks), or drop offload_param / offload_optimizer");
  if (const int rc = dstrain_cuda_host_register(p, rounded); rc != 0) {
    std::free(p);
    throw Error(ErrorCode::kEnvironment,
                fmt::format("could not pin {} of host memory for {}: {}", size, what, dstrain_cuda_error_string(rc)),
                "set zero.pin_memory: false (pageable host memory: slower copies), or raise the locked-memory limit (ulimit -l)");
  }
  return at::from_blob(
      p, {numel},
      [](void* q) {
        dstrain_cuda_host_unregister(q);
        std::free(q);
      },
      at::TensorOptions().dtype(dtype));
}

}  // namespace dstrain::device
