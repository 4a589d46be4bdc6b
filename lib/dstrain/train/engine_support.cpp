#include "dstrain/train/engine_support.h"

namespace dstrain::train {

// Every setting the config accepts now runs on the CPU engine; the GPU trainer (issue 12) will
// add its own refusals here, as "key (source): what" lines.
std::vector<std::string> unsupported_by_engine(const config::Recipe&) { return {}; }

}  // namespace dstrain::train
