#include "dstrain/core/host.h"

#include <unistd.h>

#include <chrono>

namespace dstrain {

std::string host_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

double unix_seconds() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace dstrain
