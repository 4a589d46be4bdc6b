#include "dstrain/core/cuda_elem.h"

#include <c10/core/ScalarType.h>

#include "dstrain_cuda.h"

namespace dstrain {

int cuda_elem_code(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return DSTRAIN_ELEM_F32;
    case c10::ScalarType::BFloat16:
      return DSTRAIN_ELEM_BF16;
    case c10::ScalarType::Half:
      return DSTRAIN_ELEM_F16;
    default:
      return -1;
  }
}

}  // namespace dstrain
