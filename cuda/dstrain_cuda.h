#pragma once
/* dstrain's CUDA kernels and device queries behind a plain C interface: no torch here, and no
 * CUDA headers in this file, so any translation unit may include it. Built when DSTRAIN_CUDA is
 * on (see cmake/DstrainCuda.cmake); otherwise cuda_unavailable.cpp answers "not built". */
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this binary was built with the CUDA kernels, else 0. */
int dstrain_cuda_built(void);
/* CUDA runtime version this binary was built against (e.g. 13000), or 0 when not built. */
int dstrain_cuda_runtime_version(void);
/* Installed driver's CUDA version, or 0 when there is no driver. */
int dstrain_cuda_driver_version(void);
/* Number of visible GPUs; 0 without GPU, driver or CUDA build. */
int dstrain_cuda_device_count(void);
/* NCCL version (e.g. 22809), or 0 when not built. */
int dstrain_nccl_version(void);
/* Name of device `index` into buf (NUL-terminated); returns 0 on success, else a CUDA error code. */
int dstrain_cuda_device_name(int index, char* buf, size_t buf_size);
/* Compute capability and total memory of device `index`; returns 0 or a CUDA error code. */
int dstrain_cuda_device_props(int index, int* cc_major, int* cc_minor, size_t* total_bytes);

/* Sum of squares of n floats at device pointer x, accumulated in double into *out (a device
 * pointer to one double, overwritten). Launched on `stream` (cudaStream_t, NULL = default).
 * Returns 0 or a CUDA error code. Used for global gradient norms. */
int dstrain_cuda_sum_squares_f32(const float* x, size_t n, double* out, void* stream);

/* Adam/AdamW hyperparameters of one step (the step is 1-based, for bias correction). */
typedef struct DstrainAdamParams {
  double lr, beta1, beta2, eps, weight_decay;
  int adamw; /* 1: decoupled weight decay (AdamW); 0: L2 decay added to the gradient (Adam) */
  long long step;
} DstrainAdamParams;

/* The fused Adam step on device pointers, n elements each: g is scaled by grad_scale (loss-scale
 * removal and clipping), then m, v and p are updated in one pass, with lib/dstrain/optim/
 * cpu_adam.cpp's math. Returns 0 or a CUDA error code. */
int dstrain_cuda_adam_f32(float* p, const float* g, float* m, float* v, size_t n, const DstrainAdamParams* params, float grad_scale,
                          void* stream);

/* g *= inv_scale in place; sets *found_inf (a device int) to 1 when any result is inf or nan,
 * and leaves it alone otherwise (clear it before the first buffer of a step). */
int dstrain_cuda_unscale_found_inf_f32(float* g, size_t n, float inv_scale, int* found_inf, void* stream);

/* Last CUDA error as text (for error messages). */
const char* dstrain_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif
