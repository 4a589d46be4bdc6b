// The C interface of dstrain_cuda.h for builds without CUDA: every query answers "none".
#include "dstrain_cuda.h"

#include <cstring>

extern "C" {
int dstrain_cuda_built(void) { return 0; }
int dstrain_cuda_runtime_version(void) { return 0; }
int dstrain_cuda_driver_version(void) { return 0; }
int dstrain_cuda_device_count(void) { return 0; }
int dstrain_nccl_version(void) { return 0; }
int dstrain_cuda_device_name(int, char* buf, size_t buf_size) {
  if (buf_size) buf[0] = '\0';
  return 100;  // cudaErrorNoDevice
}
int dstrain_cuda_device_props(int, int*, int*, size_t*) { return 100; }  // cudaErrorNoDevice
int dstrain_cuda_host_register(void*, size_t) { return 35; }
int dstrain_cuda_host_unregister(void*) { return 35; }
int dstrain_cuda_adam_f32(float*, const float*, float*, float*, size_t, const DstrainAdamParams*, float, void*) { return 35; }
int dstrain_cuda_unscale_found_inf_f32(float*, size_t, float, int*, void*) { return 35; }
int dstrain_cuda_sum_squares_f32(const float*, size_t, double*, void*) { return 35; }  // cudaErrorInsufficientDriver
int dstrain_cuda_step_sum_squares(const DstrainStepPiece*, int, int, double*, double*, void*) { return 35; }
int dstrain_cuda_step_adam(const DstrainStepPiece*, int, int, const DstrainAdamParams*, float, void*) { return 35; }
int dstrain_cuda_swiglu_forward(const void*, const void*, void*, long long, int, void*) { return 35; }
int dstrain_cuda_swiglu_backward(const void*, const void*, const void*, void*, void*, long long, int, void*) { return 35; }
int dstrain_cuda_rope(const void*, const void*, const void*, void*, long long, int, int, int, int, int, void*) { return 35; }
const char* dstrain_cuda_error_string(int) { return "dstrain was built without CUDA"; }
}
