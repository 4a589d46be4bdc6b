#pragma once
// What this binary is: filled in at build time (cmake/build_info.cpp.in).
#include <string>

namespace dstrain {

struct BuildInfo {
  std::string version;     // dstrain's own, e.g. "0.1.0"
  std::string git_commit;  // short hash, "-dirty" when built from uncommitted changes
  std::string compiler;    // e.g. "GNU 12.2.0"
  std::string torch_version;
  std::string build_type;
  std::string python_bin_dir;  // the bin/ of the virtualenv whose LibTorch it was built with (tensorboard lives there)
};

const BuildInfo& build_info();

}  // namespace dstrain
