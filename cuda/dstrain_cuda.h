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

/* Page-locks [p, p + bytes) of ordinary host memory for DMA with every GPU (cudaHostRegister,
 * portable): pinned memory of exactly that size (ATen's pinned allocator rounds to a power of
 * two). Unregister before freeing it. Return 0 or a CUDA error code. */
int dstrain_cuda_host_register(void* p, size_t bytes);
int dstrain_cuda_host_unregister(void* p);

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

/* The optimizer step over flat buffers (lib/dstrain/optim/fused_step.h): one piece is at most
 * 65,536 elements of one parameter run, and one thread block works on one piece. grad and
 * param_out hold elements of the model dtype (DSTRAIN_ELEM_*); param_out may be NULL. */
typedef struct DstrainStepPiece {
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grad;
  void* param_out;
  long long n;
  int decay; /* 1: weight decay applies to this piece */
  int reserved;
} DstrainStepPiece;

enum { DSTRAIN_ELEM_F32 = 0, DSTRAIN_ELEM_BF16 = 1, DSTRAIN_ELEM_F16 = 2 };

/* Sum of the squared gradients of `num_pieces` pieces (a device array), in double: each piece's
 * sum into partials[i] (device, num_pieces doubles), then their total into *out (device) in a fixed
 * order, so the result does not depend on scheduling. Returns 0 or a CUDA error code. */
int dstrain_cuda_step_sum_squares(const DstrainStepPiece* pieces, int num_pieces, int elem, double* partials, double* out, void* stream);

/* The fused Adam step over every piece, one launch: the gradient (model dtype) scaled by
 * grad_scale, m, v and the fp32 master updated with dstrain_cuda_adam_f32's math (no weight decay
 * where a piece's decay is 0), and the new master written to param_out in the model dtype
 * (rounded to nearest even) where it is not NULL. Returns 0 or a CUDA error code. */
int dstrain_cuda_step_adam(const DstrainStepPiece* pieces, int num_pieces, int elem, const DstrainAdamParams* params, float grad_scale,
                           void* stream);

/* SwiGLU's activation, element-wise over n elements of DSTRAIN_ELEM_* type (fp32 math, one
 * rounding): out = silu(gate) * up; backward: grad_gate = grad * up * silu'(gate),
 * grad_up = grad * silu(gate). Returns 0 or a CUDA error code. */
int dstrain_cuda_swiglu_forward(const void* gate, const void* up, void* out, long long n, int elem, void* stream);
int dstrain_cuda_swiglu_backward(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up, long long n, int elem,
                                 void* stream);

/* Rotary embeddings on `rows` contiguous rows of `dim` elements laid out [B, seq, heads, dim]
 * (row r is at position (r / heads) % seq), with tables cos/sin [>= seq, dim] of the same type:
 * out = x cos + rotate_half(x) sin; backward = 1: the transpose, for the gradient. out must not
 * alias x. Returns 0 or a CUDA error code. */
int dstrain_cuda_rope(const void* x, const void* cos, const void* sin, void* out, long long rows, int heads, int seq, int dim, int backward,
                      int elem, void* stream);

/* Last CUDA error as text (for error messages). */
const char* dstrain_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif
