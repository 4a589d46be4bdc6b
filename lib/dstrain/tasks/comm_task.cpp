#include "dstrain/tasks/comm_task.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/run/worker_env.h"

namespace dstrain::tasks {

std::vector<std::string> comm_task_args(const CommTask& t) {
  std::vector<std::string> args = {"--task",      t.check ? "comm-check" : "comm-bench", "--min-bytes", std::to_string(t.bench.min_bytes),
                                   "--max-bytes", std::to_string(t.bench.max_bytes),     "--iters",     std::to_string(t.bench.max_iters),
                                   "--timeout",   std::to_string(t.timeout_s),           "--backend",   t.backend};
  return args;
}

int run_comm_task(const run::WorkerEnv& env, const CommTask& task) {
  log::set_rank(env.rank);
  at::set_num_threads(env.threads);
  const comm::Endpoint ep = comm::endpoint_of(env, std::chrono::seconds(task.timeout_s));
  const bool has_gpu = env.device.rfind("cuda:", 0) == 0;
  const bool nccl = task.backend == "nccl" || (task.backend == "auto" && has_gpu && comm::nccl_available());
  if (nccl && !has_gpu)
    throw Error(ErrorCode::kEnvironment, fmt::format("rank {} has no GPU for the nccl backend", env.rank),
                "use --backend gloo on machines without GPUs");
  auto comm = nccl ? comm::make_nccl_communicator(ep, env.rank, env.world_size, std::stoi(env.device.substr(5)))
                   : comm::make_gloo_communicator(ep, env.rank, env.world_size);
  comm::report_control_sockets(*comm);
  if (task.check) return comm::check_collectives(*comm, 20261129) == 0 ? exit_status::kOk : exit_status::kComm;
  comm::bench_collectives(*comm, task.bench);
  return exit_status::kOk;
}

TaskRendezvous::TaskRendezvous() = default;
TaskRendezvous::TaskRendezvous(TaskRendezvous&&) noexcept = default;
TaskRendezvous::~TaskRendezvous() = default;

TaskRendezvous task_rendezvous(const launch::Topology& topo, const std::string& kind, std::chrono::seconds timeout) {
  TaskRendezvous r;
  r.port = topo.master_port;
  if (topo.node_rank == 0) {
    std::random_device rd;
    r.run_key = fmt::format("{}{:08x}/0", kind, rd());
    r.store = std::make_unique<comm::StoreServer>(topo.master_addr, topo.master_port, r.run_key, timeout);
    r.store->publish("task", kind);
    r.port = r.store->port();
  } else {
    r.run_key = comm::fetch_from_node_zero(topo.master_addr, topo.master_port, "task", timeout).run_key;
  }
  return r;
}

int launch_comm_task(const launch::Topology& topo, const CommTask& task, const std::string& executable) {
  const TaskRendezvous rendezvous = task_rendezvous(topo, "bench", std::chrono::seconds(task.timeout_s));
  const std::string& run_key = rendezvous.run_key;
  const int port = rendezvous.port;
  const int nproc = topo.nproc_per_node;
  launch::SupervisorOptions sup;
  sup.executable = executable;
  sup.worker_args = {"worker"};
  sup.saves_on_stop = false;
  for (const auto& a : comm_task_args(task)) sup.worker_args.push_back(a);
  sup.log_dir = (std::filesystem::temp_directory_path() / fmt::format("dstrain-bench-{}", ::getpid())).string();
  sup.workers = launch::local_worker_envs(topo, port, run_key.substr(0, run_key.rfind('/')), sup.log_dir,
                                          threads_per_worker(0, nproc, online_cores()));
  log::info(fmt::format("{} on {} ranks ({} on this node {}), rendezvous at {}:{}; worker logs in {}",
                        task.check ? "collective check" : "collective benchmark", topo.world(), nproc, topo.node_rank, topo.master_addr,
                        port, sup.log_dir));
  const int status = launch::supervise(sup);
  if (status == 0) std::filesystem::remove_all(sup.log_dir);
  return status;
}

int run_comm_task_as_rank(const launch::Topology& topo, const CommTask& task) {
  const std::string run_id = topo.shared_run_id();
  const run::WorkerEnv env = launch::rank_env(topo, run_id, "", launch::rank_threads(0, topo, online_cores(), node_cores()));
  return run_comm_task(env, task);
}

}  // namespace dstrain::tasks
