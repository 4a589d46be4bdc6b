#include "dstrain/envcheck/facts.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <fmt/format.h>

#include <fstream>

#include "dstrain/core/build_info.h"
#include "dstrain/core/threads.h"
#include "dstrain_cuda.h"

namespace dstrain::envcheck {
namespace {

// The value after "key" and a separator in the first matching line of a text file.
std::string field_of(const std::string& path, const std::string& key, char sep) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto at = line.find(sep);
    if (at == std::string::npos) continue;
    std::string v = line.substr(at + 1);
    v.erase(0, v.find_first_not_of(" \t\""));
    while (!v.empty() && (v.back() == '"' || v.back() == ' ')) v.pop_back();
    return v;
  }
  return "unknown";
}

std::string cuda_version_text(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : "none"; }

}  // namespace

Facts collect_local_facts() {
  Facts f;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  utsname u{};
  ::uname(&u);
  const auto& b = build_info();
  f.emplace_back("host", host);
  f.emplace_back("os", field_of("/etc/os-release", "PRETTY_NAME", '='));
  f.emplace_back("kernel", u.release);
  f.emplace_back("cpu", field_of("/proc/cpuinfo", "model name", ':'));
  f.emplace_back("cpu cores usable", std::to_string(online_cores()));
  const std::string mem_kb = field_of("/proc/meminfo", "MemTotal", ':');
  f.emplace_back("memory", mem_kb == "unknown" ? mem_kb : fmt::format("{:.1f} GiB", std::stod(mem_kb) / (1024.0 * 1024.0)));
  f.emplace_back("dstrain", fmt::format("{} ({})", b.version, b.git_commit));
  f.emplace_back("compiler", b.compiler);
  f.emplace_back("libtorch", b.torch_version);
  f.emplace_back("cuda kernels", dstrain_cuda_built() ? "built" : "not built");
  f.emplace_back("cuda runtime (built)", cuda_version_text(dstrain_cuda_runtime_version()));
  f.emplace_back("cuda driver", cuda_version_text(dstrain_cuda_driver_version()));
  const int nccl = dstrain_nccl_version();
  f.emplace_back("nccl", nccl > 0 ? fmt::format("{}.{}.{}", nccl / 10000, (nccl / 100) % 100, nccl % 100) : "none");
  const int gpus = dstrain_cuda_device_count();
  f.emplace_back("gpus", std::to_string(gpus));
  for (int i = 0; i < gpus; ++i) {
    char name[256];
    if (dstrain_cuda_device_name(i, name, sizeof(name)) == 0) f.emplace_back(fmt::format("gpu {}", i), name);
  }
  return f;
}

}  // namespace dstrain::envcheck
