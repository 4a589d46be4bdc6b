#include "dstrain/envcheck/facts.h"

#include <gnu/libc-version.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dstrain/core/build_info.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/core/host.h"
#include "dstrain/core/open_files.h"
#include "dstrain/core/threads.h"
#include "dstrain/core/file_checksum.h"
#include "dstrain_cuda.h"

extern char** environ;

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

// GiB with one decimal; MiB below 1 GiB (a nearly full disk is not "0.0 GiB free").
std::string gib(double bytes) {
  return bytes < 1073741824.0 ? fmt::format("{:.1f} MiB", bytes / 1048576.0) : fmt::format("{:.1f} GiB", bytes / 1073741824.0);
}

// The vector extensions the fused kernels can use, from /proc/cpuinfo's flags.
std::string cpu_isa() {
  const std::string flags = " " + field_of("/proc/cpuinfo", "flags", ':') + " ";
  std::string out;
  for (const char* f : {"avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "avx2", "fma", "sse4_2", "asimd", "sve"})
    if (flags.find(std::string(" ") + f + " ") != std::string::npos) out += (out.empty() ? "" : " ") + std::string(f);
  return out.empty() ? "baseline" : out;
}

std::string limit_text(int resource) {
  rlimit r{};
  if (::getrlimit(resource, &r) != 0) return "unknown";
  auto one = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  return one(r.rlim_cur) + " (hard " + one(r.rlim_max) + ")";
}

bool is_contract_variable(const std::string& name) {
  // Set per worker by the launcher (or by torchrun/mpirun): they differ by design.
  static const char* kPerWorker[] = {"DSTRAIN_RUN_ID",    "DSTRAIN_RUN_DIR",     "DSTRAIN_RESTART_COUNT", "DSTRAIN_THREADS",
                                     "DSTRAIN_RESUME",    "DSTRAIN_RESUME_FROM", "DSTRAIN_DEVICE",        "DSTRAIN_HOST_STORE",
                                     "DSTRAIN_ENV_CHECK", "DSTRAIN_PROGRESS",    "OMP_NUM_THREADS"};
  return std::find(std::begin(kPerWorker), std::end(kPerWorker), name) != std::end(kPerWorker) || name.rfind("DSTRAIN_TEST_", 0) == 0;
}

// Credentials: their values never leave this process (gathered facts travel through the
// rendezvous store, which any local user can read, and land in check-env's output and 0644 logs).
// Only that they are set is compared.
bool is_secret_variable(const std::string& name) {
  for (const char* word : {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "PRIVATE_KEY"})
    if (name.find(word) != std::string::npos) return true;
  return false;
}

std::string sanitize(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

const char* rule_name(Rule rule) {
  switch (rule) {
    case Rule::kSame:
      return "same";
    case Rule::kSameInNode:
      return "same-in-node";
    case Rule::kMayDiffer:
      return "may-differ";
    case Rule::kLimit:
      return "limit";
    case Rule::kNotSlow:
      return "not-slow";
  }
  return "same";
}

std::vector<std::pair<std::string, std::string>> relevant_environment() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    const bool relevant =
        name.rfind("NCCL_", 0) == 0 || name.rfind("CUDA_", 0) == 0 || name.rfind("OMP_", 0) == 0 || name.rfind("DSTRAIN_", 0) == 0;
    if (!relevant || is_contract_variable(name)) continue;
    out.emplace_back(name, is_secret_variable(name) ? std::string(kHiddenValue) : kv.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Facts collect_local_facts(const FactOptions& o) {
  Facts f;
  auto add = [&f](std::string name, std::string value, Rule rule) {
    f.push_back({std::move(name), sanitize(std::move(value)), rule, true, ""});
  };
  utsname u{};
  ::uname(&u);
  const auto& b = build_info();
  add("host", host_name(), Rule::kMayDiffer);
  // Software: the same everywhere.
  add("dstrain", fmt::format("{} ({})", b.version, b.git_commit), Rule::kSame);
  add("compiler", b.compiler, Rule::kSame);
  add("libtorch", b.torch_version, Rule::kSame);
  for (const auto& [name, value] : o.extra) add(name, value, Rule::kSame);
  add("cuda kernels", dstrain_cuda_built() ? "built" : "not built", Rule::kSame);
  add("cuda runtime (built)", cuda_version_text(dstrain_cuda_runtime_version()), Rule::kSame);
  const int driver = dstrain_cuda_driver_version();
  add("cuda driver", driver > 0 ? cuda_version_text(driver) : "none (no NVIDIA driver: no GPU can run here)", Rule::kSame);
  const int nccl = dstrain_nccl_version();
  add("nccl", nccl > 0 ? fmt::format("{}.{}.{}", nccl / 10000, (nccl / 100) % 100, nccl % 100) : "none", Rule::kSame);
  add("os", field_of("/etc/os-release", "PRETTY_NAME", '='), Rule::kSame);
  add("kernel", u.release, Rule::kSame);
  add("glibc", gnu_get_libc_version(), Rule::kSame);
  // Hardware: GPUs of one model everywhere; counts and sizes alike within a node.
  const int gpus = dstrain_cuda_device_count();
  add("gpus", gpus > 0 ? std::to_string(gpus) : "0 (none visible: the ranks would train on the CPU)", Rule::kSameInNode);
  if (gpus > 0) {
    char name[256] = {0};
    int major = 0, minor = 0;
    size_t total = 0;
    dstrain_cuda_device_name(0, name, sizeof(name));
    dstrain_cuda_device_props(0, &major, &minor, &total);
    add("gpu model", name, Rule::kSame);
    add("gpu compute capability", fmt::format("{}.{}", major, minor), Rule::kSame);
    add("gpu memory", gib(static_cast<double>(total)), Rule::kSameInNode);
  }
  add("cpu", field_of("/proc/cpuinfo", "model name", ':'), Rule::kSameInNode);
  add("cpu cores usable", std::to_string(online_cores()), Rule::kSameInNode);
  add("cpu isa", cpu_isa(), Rule::kSameInNode);
  const std::string mem_kb = field_of("/proc/meminfo", "MemTotal", ':');
  add("memory", mem_kb == "unknown" ? mem_kb : gib(std::stod(mem_kb) * 1024.0), Rule::kSameInNode);
  struct statvfs shm {};
  add("/dev/shm", ::statvfs("/dev/shm", &shm) == 0 ? gib(static_cast<double>(shm.f_blocks) * static_cast<double>(shm.f_frsize)) : "missing",
      Rule::kSameInNode);
  add("ulimit open files", limit_text(RLIMIT_NOFILE), Rule::kSameInNode);
  if (o.world_size > 0) {  // checked after main() raised the soft limit to the hard one
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    const uint64_t needed = open_files_needed(o.world_size);
    const bool enough = r.rlim_cur == RLIM_INFINITY || static_cast<uint64_t>(r.rlim_cur) >= needed;
    f.push_back({"open files for the job", fmt::format("{} (needs {} for {} ranks)", limit_text(RLIMIT_NOFILE), needed, o.world_size),
                 Rule::kLimit, enough,
                 enough ? ""
                        : fmt::format("each rank keeps a socket to every other rank: raise the hard limit to at least {} "
                                      "(ulimit -Hn, /etc/security/limits.conf, or Slurm's PropagateResourceLimits)",
                                      needed)});
  }
  add("ulimit locked memory", limit_text(RLIMIT_MEMLOCK), Rule::kSameInNode);
  for (const auto& [name, value] : relevant_environment())  // device masks are per process under srun/mpirun
    add("env " + name, value, name == "CUDA_VISIBLE_DEVICES" ? Rule::kMayDiffer : Rule::kSame);
  // Config and data: byte for byte alike.
  for (const auto& [name, path] : o.files) {
    const FileSum s = file_checksum(path);
    if (s.exists)
      add(name, fmt::format("size {}, crc32c {:08x}", s.size, s.crc32c), Rule::kSame);
    else
      f.push_back({name, sanitize("missing: " + path), Rule::kSame, false, "not found on this rank's node: copy it there or fix the path"});
  }
  // The checkpoint directory: writable, with room for the next checkpoint.
  if (!o.ckpt_dir.empty()) {
    std::error_code ec;
    std::filesystem::path dir = o.ckpt_dir;
    while (!dir.empty() && !std::filesystem::exists(dir, ec)) dir = dir.parent_path();  // the run may not have made it yet
    const bool writable = !dir.empty() && ::access(dir.c_str(), W_OK) == 0;
    Fact w{"checkpoint dir writable", writable ? "yes" : "no", Rule::kLimit, writable, ""};
    if (!writable) w.why = fmt::format("{} is not writable", dir.empty() ? o.ckpt_dir : dir.string());
    f.push_back(w);
    struct statvfs vfs {};
    const double free_bytes =
        ::statvfs(dir.c_str(), &vfs) == 0 ? static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize) : 0.0;
    Fact room{"checkpoint dir free", gib(free_bytes), Rule::kLimit, free_bytes >= o.ckpt_bytes, ""};
    if (!room.ok)
      room.why = fmt::format("{} free, one checkpoint needs {}: free space or set checkpoint.dir", gib(free_bytes), gib(o.ckpt_bytes));
    f.push_back(room);
  }
  return f;
}

void apply_injected_fact(Facts& facts, int rank) {
  const auto fact = FaultInjector::get().fact_override(rank);
  if (!fact) return;
  for (auto& f : facts)
    if (f.name == fact->first) f.value = fact->second;
}

std::string encode_facts(const Facts& facts) {
  std::string out;
  for (const auto& f : facts)
    out += fmt::format("{}\t{}\t{}\t{}\t{}\n", sanitize(f.name), rule_name(f.rule), f.ok ? 1 : 0, sanitize(f.value), sanitize(f.why));
  return out;
}

Facts decode_facts(const std::string& text) {
  Facts out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts;
    size_t start = 0, tab;
    while ((tab = line.find('\t', start)) != std::string::npos) parts.push_back(line.substr(start, tab - start)), start = tab + 1;
    parts.push_back(line.substr(start));
    if (parts.size() != 5) continue;
    Fact f{parts[0], parts[3], Rule::kSame, parts[2] == "1", parts[4]};
    for (Rule r : {Rule::kSame, Rule::kSameInNode, Rule::kMayDiffer, Rule::kLimit, Rule::kNotSlow})
      if (parts[1] == rule_name(r)) f.rule = r;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace dstrain::envcheck
