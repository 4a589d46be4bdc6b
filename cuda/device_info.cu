// Device and library queries for --version and check-env.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "dstrain_cuda.h"

extern "C" {

int dstrain_cuda_built(void) { return 1; }

int dstrain_cuda_runtime_version(void) { return CUDART_VERSION; }

int dstrain_cuda_driver_version(void) {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

int dstrain_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int dstrain_nccl_version(void) {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

int dstrain_cuda_device_name(int index, char* buf, size_t buf_size) {
  cudaDeviceProp prop;
  const cudaError_t rc = cudaGetDeviceProperties(&prop, index);
  if (rc != cudaSuccess) return static_cast<int>(rc);
  std::strncpy(buf, prop.name, buf_size);
  if (buf_size) buf[buf_size - 1] = '\0';
  return 0;
}

int dstrain_cuda_device_props(int index, int* cc_major, int* cc_minor, size_t* total_bytes) {
  cudaDeviceProp prop;
  const cudaError_t rc = cudaGetDeviceProperties(&prop, index);
  if (rc != cudaSuccess) return static_cast<int>(rc);
  *cc_major = prop.major;
  *cc_minor = prop.minor;
  *total_bytes = prop.totalGlobalMem;
  return 0;
}

const char* dstrain_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // extern "C"
