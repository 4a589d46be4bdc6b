#include "dstrain/tasks/env_task.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/envcheck/compare.h"
#include "dstrain/envcheck/rank_check.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/tasks/comm_task.h"
#include "dstrain_cuda.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;

std::vector<std::string> env_task_args(const EnvCheckTask& t) {
  std::vector<std::string> args{"--task",           "check-env",
                                "--report",         t.report_path,
                                "--timeout",        std::to_string(t.timeout_s),
                                "--max-clock-skew", fmt::format("{}", t.probes.max_clock_skew_s)};
  if (!t.config_path.empty()) args.insert(args.end(), {"--config", t.config_path});
  std::string skip;
  for (const auto& [on, name] :
       {std::pair{t.probes.allreduce, "allreduce"}, {t.probes.pairwise, "pairwise"}, {t.probes.gemm, "gemm"}, {t.probes.disk, "disk"}})
    if (!on) skip += (skip.empty() ? "" : ",") + std::string(name);
  if (!skip.empty()) args.insert(args.end(), {"--skip", skip});
  return args;
}

int run_env_task(const run::WorkerEnv& env, const EnvCheckTask& task, bool print) {
  log::set_rank(env.rank);
  at::set_num_threads(env.threads);
  const comm::Endpoint ep = comm::endpoint_of(env, std::chrono::seconds(task.timeout_s));
  auto comm = comm::make_gloo_communicator(ep, env.rank, env.world_size);
  std::optional<config::Recipe> recipe;
  if (!task.config_path.empty()) recipe = config::read_resolved_config(task.config_path);
  envcheck::ProbeOptions probes = task.probes;
  probes.device = env.device;
  const envcheck::Report report = envcheck::check_ranks(*comm, env.group_rank, recipe ? &*recipe : nullptr, probes);
  comm->barrier()->wait();  // nobody leaves while another still measures
  if (env.rank != 0) {
    // Ranks started one by one (torchrun, env://, srun) each say what is wrong with them.
    if (print && !report.own_failures.empty()) {
      fmt::print("check-env: rank {} ({}): {} (rank 0 prints the whole report)\n", env.rank, host_name(),
                 fmt::join(report.own_failures, "; "));
      return 1;
    }
    return 0;
  }
  if (print) {
    fmt::print("{}", envcheck::render_text(report));
    return report.consistent() ? 0 : 1;
  }
  write_file_atomic(task.report_path + ".txt", envcheck::render_text(report));
  write_file_atomic(task.report_path + ".json", envcheck::render_json(report) + "\n");
  return 0;
}

int launch_env_task(const launch::Topology& topo, const EnvCheckTask& task_in, bool json, const std::string& executable) {
  EnvCheckTask task = task_in;
  const TaskRendezvous rendezvous = task_rendezvous(topo, "envcheck", std::chrono::seconds(task.timeout_s));
  const std::string& run_key = rendezvous.run_key;
  const int port = rendezvous.port;
  const std::string dir = (fs::temp_directory_path() / fmt::format("dstrain-check-env-{}", ::getpid())).string();
  fs::create_directories(dir);
  task.report_path = dir + "/report";
  launch::SupervisorOptions sup;
  sup.executable = executable;
  sup.worker_args = {"worker"};
  sup.saves_on_stop = false;
  for (const auto& a : env_task_args(task)) sup.worker_args.push_back(a);
  sup.log_dir = dir;
  sup.workers = launch::local_worker_envs(topo, port, run_key.substr(0, run_key.rfind('/')), dir,
                                          threads_per_worker(0, topo.nproc_per_node, online_cores()));
  log::info(fmt::format("check-env on {} ranks ({} on node {}), rendezvous at {}:{}", topo.world(), topo.nproc_per_node, topo.node_rank,
                        topo.master_addr, port));
  const int status = launch::supervise(sup);
  if (status != 0) {
    log::error(fmt::format("check-env could not finish (worker logs in {})", dir));
    return status;
  }
  int result = exit_status::kOk;
  if (topo.node_rank == 0) {
    const std::string text = read_file(task.report_path + ".txt");
    fmt::print("{}", json ? read_file(task.report_path + ".json") : text);
    result = text.find("\nconsistent: ") == std::string::npos ? 1 : exit_status::kOk;
  }
  fs::remove_all(dir);
  return result;
}

int run_env_task_as_rank(const launch::Topology& topo, const EnvCheckTask& task) {
  run::WorkerEnv env = launch::rank_env(topo, topo.shared_run_id(), "", launch::rank_threads(0, topo, online_cores(), node_cores()));
  return run_env_task(env, task, /*print=*/true);
}

int run_env_local(const EnvCheckTask& task, bool json) {
  std::optional<config::Recipe> recipe;
  if (!task.config_path.empty()) recipe = config::read_resolved_config(task.config_path);
  envcheck::ProbeOptions probes = task.probes;
  probes.device = dstrain_cuda_device_count() > 0 ? "cuda:0" : "cpu";
  const envcheck::Report report = envcheck::check_local(recipe ? &*recipe : nullptr, probes);
  fmt::print("{}", json ? envcheck::render_json(report) + "\n" : envcheck::render_text(report));
  return report.consistent() ? 0 : 1;
}

}  // namespace dstrain::tasks
