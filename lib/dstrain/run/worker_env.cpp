#include "dstrain/run/worker_env.h"

#include <fmt/format.h>

#include <cstdlib>

#include "dstrain/core/error.h"

namespace dstrain::run {
namespace {

std::string required(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw Error(ErrorCode::kEnvironment, fmt::format("environment variable {} is not set", name),
                "workers are started by `dstrain train` (or torchrun/srun/mpirun, which set it); do not run `dstrain worker` by hand");
  return v;
}

int required_int(const char* name, int min) {
  const std::string v = required(name);
  try {
    size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n >= min) return n;
  } catch (const std::exception&) {}
  throw Error(ErrorCode::kEnvironment, fmt::format("environment variable {}='{}' is not an integer >= {}", name, v, min),
              "fix or unset it; the launcher sets it for each worker");
}

std::string optional(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

WorkerEnv worker_env_from_environment() {
  WorkerEnv env;
  env.rank = required_int("RANK", 0);
  env.world_size = required_int("WORLD_SIZE", 1);
  env.local_rank = required_int("LOCAL_RANK", 0);
  env.local_world_size = required_int("LOCAL_WORLD_SIZE", 1);
  env.group_rank = std::getenv("GROUP_RANK") ? required_int("GROUP_RANK", 0) : 0;
  env.master_addr = required("MASTER_ADDR");
  env.master_port = required_int("MASTER_PORT", 1);
  env.run_id = required("DSTRAIN_RUN_ID");
  env.run_dir = required("DSTRAIN_RUN_DIR");
  env.restart_count = std::getenv("DSTRAIN_RESTART_COUNT") ? required_int("DSTRAIN_RESTART_COUNT", 0) : 0;
  env.threads = std::getenv("DSTRAIN_THREADS") ? required_int("DSTRAIN_THREADS", 1) : 1;
  env.resume = optional("DSTRAIN_RESUME", "0") == "1";
  env.resume_from = optional("DSTRAIN_RESUME_FROM", "");
  env.env_check = optional("DSTRAIN_ENV_CHECK", "1") != "0";
  env.device = optional("DSTRAIN_DEVICE", "cpu");
  env.progress_line = optional("DSTRAIN_PROGRESS", "0") == "1";
  if (env.rank >= env.world_size)
    throw Error(ErrorCode::kEnvironment, fmt::format("RANK={} is not below WORLD_SIZE={}", env.rank, env.world_size),
                "check the launcher's settings");
  return env;
}

std::string store_run_key(const WorkerEnv& env) { return env.run_id + "/" + std::to_string(env.restart_count); }

std::vector<std::string> worker_env_assignments(const WorkerEnv& e) {
  return {
      fmt::format("RANK={}", e.rank),
      fmt::format("LOCAL_RANK={}", e.local_rank),
      fmt::format("WORLD_SIZE={}", e.world_size),
      fmt::format("LOCAL_WORLD_SIZE={}", e.local_world_size),
      fmt::format("GROUP_RANK={}", e.group_rank),
      fmt::format("MASTER_ADDR={}", e.master_addr),
      fmt::format("MASTER_PORT={}", e.master_port),
      fmt::format("DSTRAIN_RUN_ID={}", e.run_id),
      fmt::format("DSTRAIN_RUN_DIR={}", e.run_dir),
      fmt::format("DSTRAIN_RESTART_COUNT={}", e.restart_count),
      fmt::format("DSTRAIN_THREADS={}", e.threads),
      fmt::format("OMP_NUM_THREADS={}", e.threads),
      fmt::format("DSTRAIN_RESUME={}", e.resume ? 1 : 0),
      fmt::format("DSTRAIN_RESUME_FROM={}", e.resume_from),
      fmt::format("DSTRAIN_DEVICE={}", e.device),
      fmt::format("DSTRAIN_ENV_CHECK={}", e.env_check ? 1 : 0),
      fmt::format("DSTRAIN_PROGRESS={}", e.progress_line ? 1 : 0),
  };
}

}  // namespace dstrain::run
