#include "dstrain/train/env_task.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/config/describe.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/envcheck/compare.h"
#include "dstrain/envcheck/facts.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/train/comm_task.h"
#include "dstrain/train/run_dir.h"
#include "dstrain/train/training_device.h"
#include "dstrain_cuda.h"

namespace dstrain::train {
namespace fs = std::filesystem;
using envcheck::Fact;
using envcheck::Rule;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "KEY=value" from the "Build settings:" line of at::show_config().
std::string build_setting(const std::string& config, const std::string& key) {
  const auto at = config.find(key + "=");
  if (at == std::string::npos) return "";
  const auto start = at + key.size() + 1;
  return config.substr(start, config.find(',', start) - start);
}

// The LibTorch build as facts: its commit and the CUDA/cuDNN/NCCL it was built with.
std::vector<std::pair<std::string, std::string>> torch_build_facts() {
  const std::string config = at::show_config();
  const std::string commit = build_setting(config, "COMMIT_SHA");
  const std::string cuda = build_setting(config, "CUDA_VERSION");
  const std::string cudnn = build_setting(config, "CUDNN_VERSION");
  return {{"libtorch build", fmt::format("commit {}, CUDA {}, NCCL {}", commit.substr(0, 12), cuda.empty() ? "none" : cuda,
                                         build_setting(config, "USE_NCCL") == "1" ? "on" : "off")},
          {"cudnn (libtorch)", cudnn.empty() ? "none" : cudnn}};
}

envcheck::FactOptions fact_options(const config::Recipe* recipe, int rank) {
  envcheck::FactOptions o;
  o.extra = torch_build_facts();
  if (!recipe) return o;
  o.extra.emplace_back("config hash", config::config_hash(*recipe));
  if (!recipe->source_path.empty()) o.files.emplace_back("recipe file", recipe->source_path);
  if (!recipe->ds_config_path.empty()) o.files.emplace_back("ds_config file", recipe->ds_config_path);
  const std::vector<std::string> paths = recipe->data.paths.empty() ? std::vector<std::string>{recipe->data.path} : recipe->data.paths;
  const std::string substitute = FaultInjector::get().data_path_override(rank);  // a node with another copy of the data
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string name = paths.size() == 1 ? "data" : fmt::format("data {}", i);
    std::string path = substitute.empty() ? paths[i] : substitute;
    if (recipe->data.format == config::DataFormat::kMegatron) {
      for (const char* ext : {".idx", ".bin"}) {
        std::string prefix = path;
        for (const char* strip : {".bin", ".idx"})
          if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, strip) == 0) prefix.resize(prefix.size() - 4);
        o.files.emplace_back(name + ext, prefix + ext);
      }
    } else {
      o.files.emplace_back(name, path);
    }
  }
  o.ckpt_dir = RunDir(recipe->run_dir).ckpt_dir(*recipe);
  o.ckpt_bytes = 12.0 * static_cast<double>(config::parameter_counts(recipe->model).total);  // fp32 master + Adam moments
  return o;
}

// Wall clocks after a barrier: each rank's offset from rank 0 (the barrier's own skew, a few ms,
// is the resolution).
Fact clock_fact(comm::Communicator& comm, double limit_s) {
  comm.barrier()->wait();
  const double now = unix_seconds();
  at::Tensor mine = at::tensor({now}, at::kDouble).view(at::kLong);  // Gloo moves the bytes
  at::Tensor all = at::empty({comm.world_size()}, at::kLong);
  comm.all_gather(mine, all)->wait();
  const double offset = now - all.view(at::kDouble)[0].item<double>();
  Fact f{"clock offset from rank 0", fmt::format("{:+.3f} s", offset), Rule::kLimit, std::abs(offset) <= limit_s, ""};
  if (!f.ok) f.why = fmt::format("clocks differ by more than {:g} s: run NTP/chrony on every node", limit_s);
  return f;
}

// All-reduce correctness (integers, exact in fp32) and bus bandwidth on 16 MiB.
std::vector<Fact> allreduce_facts(comm::Communicator& comm) {
  const int64_t n = 4 << 20;
  const int world = comm.world_size();
  at::Tensor t = at::arange(n, at::kFloat).remainder(1000).add_(static_cast<float>(comm.rank() + 1));
  comm.all_reduce(t)->wait();
  const at::Tensor want = at::arange(n, at::kFloat).remainder(1000).mul_(static_cast<float>(world)).add_(static_cast<float>(world * (world + 1) / 2));
  const bool right = at::equal(t, want);
  Fact check{"all-reduce result", right ? "correct" : "wrong", Rule::kLimit, right, right ? "" : "the sum differs from the expected one on this rank"};
  comm.all_reduce(t)->wait();  // warm-up
  const int iters = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) comm.all_reduce(t)->wait();
  const double s = seconds_since(t0) / iters;
  const double busbw = world > 1 ? 2.0 * (world - 1) / world * static_cast<double>(n * 4) / s / 1e9 : 0.0;
  std::vector<Fact> out{check};
  if (comm.rank() == 0) out.push_back({"all-reduce bus bandwidth", fmt::format("{:.2f} GB/s (16 MiB, {} ranks)", busbw, world), Rule::kMayDiffer, true, ""});
  return out;
}

// Links between nodes: the first rank of each node exchanges 16 MiB with the first rank of every
// other node, in rounds of disjoint pairs (the circle method); each reports its slowest link.
std::vector<Fact> pairwise_facts(comm::Communicator& comm, int nnodes, int per_node) {
  if (nnodes < 2 || per_node < 1 || comm.world_size() != nnodes * per_node) return {};
  const int me = comm.rank();
  const bool leader = me % per_node == 0;
  const int my_node = me / per_node;
  const int slots = nnodes % 2 == 0 ? nnodes : nnodes + 1;  // a bye when odd
  at::Tensor buf = at::ones({4 << 20}, at::kFloat), in = at::empty({4 << 20}, at::kFloat);
  double slowest = 1e30;
  int slowest_peer = -1;
  for (int round = 0; round < slots - 1; ++round) {
    if (leader) {
      // Circle method: slot 0 stays, the others rotate.
      auto slot_node = [&](int slot) { return slot == 0 ? 0 : 1 + (slot - 1 + round) % (slots - 1); };
      int peer = -1;
      for (int slot = 0; slot < slots; ++slot) {
        if (slot_node(slot) != my_node) continue;
        const int other_slot = slots - 1 - slot;
        peer = slot_node(other_slot);
      }
      if (peer >= 0 && peer < nnodes && peer != my_node) {
        const int peer_rank = peer * per_node;
        const auto t0 = std::chrono::steady_clock::now();
        for (int rep = 0; rep < 2; ++rep) {  // both directions, lower node sends first
          if ((my_node < peer) == (rep == 0)) comm.send(buf, peer_rank)->wait();
          else comm.recv(in, peer_rank)->wait();
        }
        const double gbps = 2.0 * static_cast<double>(buf.numel() * 4) / seconds_since(t0) / 1e9;
        if (gbps < slowest) slowest = gbps, slowest_peer = peer;
      }
    }
    comm.barrier()->wait();
  }
  if (!leader || slowest_peer < 0) return {};
  return {{"inter-node link (slowest from this node)", fmt::format("{:.2f} GB/s to node {}", slowest, slowest_peer), Rule::kNotSlow, true, ""}};
}

// Matrix multiply throughput on this rank's device: a bf16 4096^2 GEMM on a GPU (what training
// runs), an fp32 512^2 one on the CPU's threads.
Fact gemm_fact(const std::string& device) {
  if (device.rfind("cuda:", 0) == 0) {
    const c10::Device gpu(device);
    const double tflops = measured_gpu_peak_tflops(gpu, config::Dtype::kBf16);
    return {"gemm throughput (bf16 4096, gpu)", fmt::format("{:.1f} GFLOP/s", tflops * 1e3), Rule::kNotSlow, true, ""};
  }
  const int64_t n = 512;
  at::Tensor a = at::randn({n, n}, at::kFloat), b = at::randn({n, n}, at::kFloat);
  at::mm(a, b);  // warm-up
  int iters = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (iters < 3 || seconds_since(t0) < 0.3) at::mm(a, b), ++iters;
  const double gflops = 2.0 * n * n * n * iters / seconds_since(t0) / 1e9;
  return {"gemm throughput (fp32 512, cpu)", fmt::format("{:.1f} GFLOP/s", gflops), Rule::kNotSlow, true, ""};
}

// Sequential write speed of the checkpoint directory (64 MiB, fdatasync), once per node.
std::optional<Fact> disk_fact(const std::string& dir) {
  std::error_code ec;
  fs::path where = dir;
  while (!where.empty() && !fs::exists(where, ec)) where = where.parent_path();
  if (where.empty()) return std::nullopt;
  const std::string path = (where / fmt::format(".dstrain-speed-{}", ::getpid())).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::nullopt;
  std::vector<char> block(4 << 20, 'd');
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  for (int i = 0; i < 16 && ok; ++i) ok = ::write(fd, block.data(), block.size()) == static_cast<ssize_t>(block.size());
  ok = ok && ::fdatasync(fd) == 0;
  const double s = seconds_since(t0);
  ::close(fd);
  fs::remove(path, ec);
  if (!ok) return std::nullopt;
  // Shown per node, never a mismatch: 64 MiB through the page cache and fdatasync is too noisy
  // (and shared filesystems too shared) for a pass/fail rule.
  return Fact{"checkpoint dir write speed", fmt::format("{:.0f} MB/s", 64.0 * 1048576.0 / s / 1e6), Rule::kMayDiffer, true, ""};
}

}  // namespace

std::vector<std::string> env_task_args(const EnvCheckTask& t) {
  std::vector<std::string> args{"--task", "check-env", "--report", t.report_path, "--timeout", std::to_string(t.timeout_s),
                                "--max-clock-skew", fmt::format("{}", t.max_clock_skew_s)};
  if (!t.config_path.empty()) args.insert(args.end(), {"--config", t.config_path});
  std::string skip;
  for (const auto& [on, name] : {std::pair{t.allreduce, "allreduce"}, {t.pairwise, "pairwise"}, {t.gemm, "gemm"}, {t.disk, "disk"}})
    if (!on) skip += (skip.empty() ? "" : ",") + std::string(name);
  if (!skip.empty()) args.insert(args.end(), {"--skip", skip});
  return args;
}

envcheck::Report check_ranks(comm::Communicator& comm, int node, const config::Recipe* recipe, const EnvCheckTask& task) {
  const int rank = comm.rank(), world = comm.world_size();
  envcheck::Facts facts = envcheck::collect_local_facts(fact_options(recipe, rank));
  envcheck::apply_injected_fact(facts, rank);
  facts.push_back(clock_fact(comm, task.max_clock_skew_s));
  // The ranks of a node, and the number of nodes, from everyone's node index.
  at::Tensor mine = at::tensor({static_cast<int64_t>(node)}, at::kLong), nodes = at::empty({world}, at::kLong);
  comm.all_gather(mine, nodes)->wait();
  const int nnodes = static_cast<int>(nodes.max().item<int64_t>()) + 1;
  int local_index = 0, per_node_max = 0;  // this rank's place among its node's ranks
  std::map<int64_t, int> count_of_node;
  for (int r = 0; r < world; ++r) {
    const int c = ++count_of_node[nodes[r].item<int64_t>()];
    if (r == rank) local_index = c - 1;
    per_node_max = std::max(per_node_max, c);
  }
  const bool first_of_node = local_index == 0;
  if (task.allreduce) for (auto& f : allreduce_facts(comm)) facts.push_back(std::move(f));
  if (task.pairwise) for (auto& f : pairwise_facts(comm, nnodes, world / std::max(nnodes, 1))) facts.push_back(std::move(f));
  // GEMM: the ranks of a node take turns (the nodes in parallel), so each measures its own
  // device and threads rather than its neighbours' contention.
  if (task.gemm)
    for (int turn = 0; turn < per_node_max; ++turn) {
      if (turn == local_index) facts.push_back(gemm_fact(task.device));
      comm.barrier()->wait();
    }
  if (task.disk) {  // one rank per node, the nodes in turns (a shared filesystem would split its speed)
    const std::string dir = recipe ? RunDir(recipe->run_dir).ckpt_dir(*recipe) : fs::current_path().string();
    for (int turn = 0; turn < nnodes; ++turn) {
      if (first_of_node && turn == node)
        if (auto f = disk_fact(dir)) facts.push_back(*f);
      comm.barrier()->wait();
    }
  }
  const std::vector<std::string> all = comm.all_gather_bytes(envcheck::encode_facts(facts));
  envcheck::Report report;
  if (rank != 0) return report;
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back({r, static_cast<int>(nodes[r].item<int64_t>()), envcheck::decode_facts(all[static_cast<size_t>(r)])});
  return envcheck::compare(ranks);
}

int run_env_task(const launch::WorkerEnv& env, const EnvCheckTask& task, bool print) {
  log::set_rank(env.rank);
  at::set_num_threads(env.threads);
  const comm::Endpoint ep{env.master_addr, env.master_port, launch::store_run_key(env), std::chrono::seconds(task.timeout_s), env.host_store};
  auto comm = comm::make_gloo_communicator(ep, env.rank, env.world_size);
  std::optional<config::Recipe> recipe;
  if (!task.config_path.empty()) recipe = config::read_resolved_config(task.config_path);
  EnvCheckTask on_device = task;
  on_device.device = env.device;
  const envcheck::Report report = check_ranks(*comm, env.group_rank, recipe ? &*recipe : nullptr, on_device);
  comm->barrier()->wait();  // nobody leaves while another still measures
  if (env.rank != 0) return 0;
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
  for (const auto& a : env_task_args(task)) sup.worker_args.push_back(a);
  sup.log_dir = dir;
  sup.workers = launch::local_worker_envs(topo, port, run_key.substr(0, run_key.rfind('/')), dir, threads_per_worker(0, topo.nproc_per_node, online_cores()));
  log::info(fmt::format("check-env on {} ranks ({} on node {}), rendezvous at {}:{}", topo.world(), topo.nproc_per_node, topo.node_rank, topo.master_addr, port));
  const int status = launch::supervise(sup);
  if (status != 0) {
    log::error(fmt::format("check-env could not finish (worker logs in {})", dir));
    return status;
  }
  int result = exit_status::kOk;
  if (topo.node_rank == 0) {
    const std::string text = read_file(task.report_path + ".txt");
    fmt::print("{}", json ? read_file(task.report_path + ".json") : text);
    result = text.find(" mismatch") != std::string::npos ? 1 : exit_status::kOk;
  }
  fs::remove_all(dir);
  return result;
}

int run_env_task_as_rank(const launch::Topology& topo, const EnvCheckTask& task) {
  launch::WorkerEnv env = launch::rank_env(topo, topo.shared_run_id(), "", threads_per_worker(0, topo.local_world_size, online_cores()));
  return run_env_task(env, task, /*print=*/true);
}

int run_env_local(const EnvCheckTask& task, bool json) {
  std::optional<config::Recipe> recipe;
  if (!task.config_path.empty()) recipe = config::read_resolved_config(task.config_path);
  envcheck::Facts facts = envcheck::collect_local_facts(fact_options(recipe ? &*recipe : nullptr, 0));
  if (task.gemm) facts.push_back(gemm_fact(dstrain_cuda_device_count() > 0 ? "cuda:0" : "cpu"));
  if (task.disk)
    if (auto f = disk_fact(recipe ? RunDir(recipe->run_dir).ckpt_dir(*recipe) : fs::current_path().string())) facts.push_back(*f);
  const envcheck::Report report = envcheck::compare({{0, 0, facts}});
  fmt::print("{}", json ? envcheck::render_json(report) + "\n" : envcheck::render_text(report));
  return report.consistent() ? 0 : 1;
}

void preflight_env_check(comm::Communicator& comm, int node, const config::Recipe& recipe) {
  EnvCheckTask task;
  task.allreduce = task.pairwise = task.gemm = task.disk = false;
  task.max_clock_skew_s = 5.0;  // only gross skew stops a job; check-env reports finer
  const auto t0 = std::chrono::steady_clock::now();
  const envcheck::Report report = check_ranks(comm, node, &recipe, task);
  // Rank 0's verdict for everyone.
  const std::string verdict = comm.all_gather_bytes(comm.rank() == 0 ? fmt::format("{}", fmt::join(report.mismatches(), ", ")) : "").at(0);
  if (verdict.empty()) {
    if (comm.rank() == 0) log::info(fmt::format("environment check: {} facts agree on all {} ranks ({:.2f} s)", report.rows.size(), comm.world_size(), seconds_since(t0)));
    return;
  }
  if (comm.rank() == 0) log::error("environment check failed:\n" + envcheck::render_text(report));
  throw Error(ErrorCode::kEnvironment, "the ranks' environments differ: " + verdict + " (the report is in rank 0's log)",
              "make the nodes alike (see `dstrain check-env`), or start with --skip-env-check (launch.env_check: false)");
}

}  // namespace dstrain::train
