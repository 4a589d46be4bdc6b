#pragma once
// The element-type code dstrain's CUDA kernels take (DSTRAIN_ELEM_* in cuda/dstrain_cuda.h) for a
// tensor's dtype. One mapping for every caller: the optimizer step and the fused layers.
#include <cstdint>

namespace c10 {
enum class ScalarType : int8_t;
}  // namespace c10

namespace dstrain {

// DSTRAIN_ELEM_F32, _BF16 or _F16; -1 for any other dtype (the kernels do not read it).
int cuda_elem_code(c10::ScalarType dtype);

}  // namespace dstrain
