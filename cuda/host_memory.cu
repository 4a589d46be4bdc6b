// Page-locking ordinary host memory (cudaHostRegister): pinned buffers of exactly the size asked
// for, where ATen's caching host allocator rounds every block up to a power of two.
#include <cuda_runtime_api.h>

#include "dstrain_cuda.h"

extern "C" {

int dstrain_cuda_host_register(void* p, size_t bytes) { return static_cast<int>(cudaHostRegister(p, bytes, cudaHostRegisterPortable)); }

int dstrain_cuda_host_unregister(void* p) { return static_cast<int>(cudaHostUnregister(p)); }

}  // extern "C"
