#pragma once
// Page-locked host memory of exactly the size asked for, for the buffers that offload copies to
// and from a GPU. ATen's pinned allocator (the caching host allocator) rounds every block up to a
// power of two: a 7B model's 27.6 GB of fp32 master weights would pin 34.4 GB, and its two 13.8 GB
// bf16 buffers 17.2 GB each, which is what decides whether the model fits the host. This allocates
// ordinary page-aligned memory and registers it with CUDA (cudaHostRegister), unregistering and
// freeing it with the tensor's storage.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dstrain::device {

// A 1-D host tensor of `numel` elements of `dtype`, uninitialised, pinned for DMA. `what` names
// the buffer in the error. Where CUDA refuses to register memory (some sandboxes), it falls back
// to ATen's pinned allocator with a warning. Throws Error{kEnvironment} when the memory cannot be
// had or pinned (hint: zero.pin_memory: false), and without a GPU.
at::Tensor pinned_empty(int64_t numel, at::ScalarType dtype, const std::string& what);

}  // namespace dstrain::device
