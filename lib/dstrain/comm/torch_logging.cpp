#include "dstrain/comm/torch_logging.h"

#include <c10/util/Logging.h>

#include <cstdlib>

namespace dstrain::comm {

void quiet_torch_logging() {
  if (const char* asked = std::getenv("TORCH_CPP_LOG_LEVEL"); asked && *asked) return;
  FLAGS_caffe2_log_level = 3;  // c10's FATAL: c10d's warnings and errors (and their backtraces) stay off
}

}  // namespace dstrain::comm
