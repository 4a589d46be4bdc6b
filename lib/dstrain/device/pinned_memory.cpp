#include "dstrain/device/pinned_memory.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain_cuda.h"

namespace dstrain::device {

at::Tensor pinned_empty(int64_t numel, at::ScalarType dtype, const std::string& what) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 1)) * at::elementSize(dtype);
  const size_t rounded = (bytes + page - 1) / page * page;
  const std::string size = cost::bytes_text(static_cast<double>(rounded));
  void* p = nullptr;
  if (posix_memalign(&p, page, rounded) != 0)
    throw Error(ErrorCode::kEnvironment, fmt::format("could not allocate {} of host memory for {}", size, what),
                "free host memory, use more ranks (the shard shrinks), or drop offload_param / offload_optimizer");
  const int rc = dstrain_cuda_host_register(p, rounded);
  if (rc == 0)
    return at::from_blob(
        p, {numel},
        [](void* q) {
          dstrain_cuda_host_unregister(q);
          std::free(q);
        },
        at::TensorOptions().dtype(dtype));
  std::free(p);
  if (!dstrain_cuda_built() || dstrain_cuda_device_count() == 0)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("could not pin {} of host memory for {}: {}", size, what, dstrain_cuda_error_string(rc)),
                "pinned memory is for copies to a GPU; set zero.pin_memory: false");
  // Some sandboxes refuse to register memory they did not allocate: ATen's pinned allocator
  // (cudaHostAlloc) still works there, at its power-of-two sizes.
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    log::warn(
        fmt::format("cudaHostRegister refused ({}): pinned host buffers come from ATen's allocator, rounded up to powers of two "
                    "(more host memory; zero.pin_memory: false avoids it at the price of slower copies)",
                    dstrain_cuda_error_string(rc)));
  try {
    return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(true));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kEnvironment, fmt::format("could not pin {} of host memory for {}: {}", size, what, e.what()),
                "set zero.pin_memory: false (pageable host memory: slower copies), or free host memory");
  }
}

}  // namespace dstrain::device
