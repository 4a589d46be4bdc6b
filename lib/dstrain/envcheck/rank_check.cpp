#include "dstrain/envcheck/rank_check.h"

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
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/device/training_device.h"
#include "dstrain/envcheck/compare.h"
#include "dstrain/envcheck/facts.h"
#include "dstrain/run/run_dir.h"

namespace dstrain::envcheck {
namespace fs = std::filesystem;

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

FactOptions fact_options(const config::Recipe* recipe, int rank) {
  FactOptions o;
  o.extra = torch_build_facts();
  if (!recipe) return o;
  o.extra.emplace_back("config hash", config::config_hash(*recipe));
  o.world_size = recipe->world_size();
  if (!recipe->source_path.empty()) o.files.emplace_back("recipe file", recipe->source_path);
  if (!recipe->ds_config_path.empty()) o.files.emplace_back("ds_config file", recipe->ds_config_path);
  const std::vector<std::string> paths = recipe->data.sources();
  const std::string substitute = FaultInjector::get().data_path_override(rank);  // a node with another copy of the data
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string name = paths.size() == 1 ? "data" : fmt::format("data {}", i);
    std::string path = substitute.empty() ? paths[i] : substitute;
    if (recipe->data.format == config::DataFormat::kMegatron) {
      const std::string prefix = config::megatron_prefix(path);
      for (const char* ext : {".idx", ".bin"}) o.files.emplace_back(name + ext, prefix + ext);
      // A fine-tuning set's mask decides what trains: every rank must read the same one.
      if (std::filesystem::is_regular_file(prefix + ".lossmask")) o.files.emplace_back(name + ".lossmask", prefix + ".lossmask");
    } else {
      o.files.emplace_back(name, path);
    }
  }
  o.ckpt_dir = run::RunDir(recipe->run_dir).ckpt_dir(*recipe);
  o.ckpt_bytes = 12.0 * static_cast<double>(cost::parameter_counts(recipe->model).total);  // fp32 master + Adam moments
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
  const at::Tensor want =
      at::arange(n, at::kFloat).remainder(1000).mul_(static_cast<float>(world)).add_(static_cast<float>(world * (world + 1) / 2));
  const bool right = at::equal(t, want);
  Fact check{"all-reduce result", right ? "correct" : "wrong", Rule::kLimit, right,
             right ? "" : "the sum differs from the expected one on this rank"};
  comm.all_reduce(t)->wait();  // warm-up
  const int iters = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) comm.all_reduce(t)->wait();
  const double s = seconds_since(t0) / iters;
  const double busbw = world > 1 ? 2.0 * (world - 1) / world * static_cast<double>(n * 4) / s / 1e9 : 0.0;
  std::vector<Fact> out{check};
  if (comm.rank() == 0)
    out.push_back({"all-reduce bus bandwidth",
                   world > 1 ? fmt::format("{:.2f} GB/s (16 MiB, {} ranks)", busbw, world) : "not measured (one rank has no peer)",
                   Rule::kMayDiffer, true, ""});
  return out;
}

// Uneven all-to-all correctness (MoE's token dispatch): rank s sends (s + d) % 3 rows to rank d,
// zero rows to some, each row naming its sender, receiver and place; every rank checks what it got.
Fact alltoall_fact(comm::Communicator& comm) {
  const int world = comm.world_size(), me = comm.rank();
  auto rows = [](int src, int dst) { return static_cast<int64_t>((src + dst) % 3); };
  auto row_value = [](int src, int dst, int64_t i) { return static_cast<float>(src * 10000 + dst * 10 + i); };
  std::vector<int64_t> send(static_cast<size_t>(world)), recv(static_cast<size_t>(world));
  std::vector<float> out, want;
  for (int r = 0; r < world; ++r) {
    send[static_cast<size_t>(r)] = rows(me, r), recv[static_cast<size_t>(r)] = rows(r, me);
    for (int64_t i = 0; i < rows(me, r); ++i) out.insert(out.end(), 4, row_value(me, r, i));
    for (int64_t i = 0; i < rows(r, me); ++i) want.insert(want.end(), 4, row_value(r, me, i));
  }
  const at::Tensor input = at::tensor(out, at::kFloat).view({static_cast<int64_t>(out.size()) / 4, 4}).to(comm.device());
  at::Tensor got = at::full({static_cast<int64_t>(want.size()) / 4, 4}, -1.0f, at::TensorOptions().device(comm.device()));
  comm.all_to_all(input, got, send, recv)->wait();
  const bool right = at::equal(got.cpu(), at::tensor(want, at::kFloat).view({static_cast<int64_t>(want.size()) / 4, 4}));
  return {"all-to-all result", right ? "correct" : "wrong", Rule::kLimit, right,
          right ? "" : "the rows this rank received differ from what the others sent it (uneven all-to-all)"};
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
          if ((my_node < peer) == (rep == 0))
            comm.send(buf, peer_rank)->wait();
          else
            comm.recv(in, peer_rank)->wait();
        }
        const double gbps = 2.0 * static_cast<double>(buf.numel() * 4) / seconds_since(t0) / 1e9;
        if (gbps < slowest) slowest = gbps, slowest_peer = peer;
      }
    }
    comm.barrier()->wait();
  }
  if (!leader || slowest_peer < 0) return {};
  return {
      {"inter-node link (slowest from this node)", fmt::format("{:.2f} GB/s to node {}", slowest, slowest_peer), Rule::kNotSlow, true, ""}};
}

// Matrix multiply throughput on this rank's device: a bf16 4096^2 GEMM on a GPU (what training
// runs), an fp32 512^2 one on the CPU's threads.
Fact gemm_fact(const std::string& device) {
  if (device.rfind("cuda:", 0) == 0) {
    const c10::Device gpu(device);
    const double tflops = device::measured_gpu_peak_tflops(gpu, config::Dtype::kBf16);
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

Report check_ranks(comm::Communicator& comm, int node, const config::Recipe* recipe, const ProbeOptions& task) {
  const int rank = comm.rank(), world = comm.world_size();
  Facts facts = collect_local_facts(fact_options(recipe, rank));
  apply_injected_fact(facts, rank);
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
  if (task.allreduce) {
    for (auto& f : allreduce_facts(comm)) facts.push_back(std::move(f));
    facts.push_back(alltoall_fact(comm));
  }
  if (task.pairwise)
    for (auto& f : pairwise_facts(comm, nnodes, world / std::max(nnodes, 1))) facts.push_back(std::move(f));
  // GEMM: the ranks of a node take turns (the nodes in parallel), so each measures its own
  // device and threads rather than its neighbours' contention.
  if (task.gemm)
    for (int turn = 0; turn < per_node_max; ++turn) {
      if (turn == local_index) facts.push_back(gemm_fact(task.device));
      comm.barrier()->wait();
    }
  if (task.disk) {  // one rank per node, the nodes in turns (a shared filesystem would split its speed)
    const std::string dir = recipe ? run::RunDir(recipe->run_dir).ckpt_dir(*recipe) : fs::current_path().string();
    for (int turn = 0; turn < nnodes; ++turn) {
      if (first_of_node && turn == node)
        if (auto f = disk_fact(dir)) facts.push_back(*f);
      comm.barrier()->wait();
    }
  }
  // Only rank 0 compares: gathered to it, not all-gathered (21 MB into every rank at 16k ranks).
  const std::vector<std::string> all = comm.gather_bytes(encode_facts(facts), 0);
  std::vector<std::string> own_failures;
  for (const auto& f : facts)
    if (!f.ok)
      own_failures.push_back(f.why.empty() ? fmt::format("{}: {}", f.name, f.value) : fmt::format("{}: {} ({})", f.name, f.value, f.why));
  Report report;
  if (rank == 0) {
    std::vector<RankFacts> ranks;
    for (int r = 0; r < world; ++r)
      ranks.push_back({r, static_cast<int>(nodes[r].item<int64_t>()), decode_facts(all[static_cast<size_t>(r)])});
    report = compare(ranks);
  }
  report.own_failures = std::move(own_failures);
  return report;
}

Report check_local(const config::Recipe* recipe, const ProbeOptions& probes) {
  Facts facts = collect_local_facts(fact_options(recipe, 0));
  if (probes.gemm) facts.push_back(gemm_fact(probes.device));
  if (probes.disk)
    if (auto f = disk_fact(recipe ? run::RunDir(recipe->run_dir).ckpt_dir(*recipe) : fs::current_path().string())) facts.push_back(*f);
  return compare({{0, 0, facts}});
}

void preflight_env_check(comm::Communicator& comm, int node, const config::Recipe& recipe) {
  ProbeOptions task;
  task.allreduce = task.pairwise = task.gemm = task.disk = false;
  task.max_clock_skew_s = 5.0;  // only gross skew stops a job; check-env reports finer
  const auto t0 = std::chrono::steady_clock::now();
  const Report report = check_ranks(comm, node, &recipe, task);
  // Rank 0's verdict for everyone: "D" when ranks disagree, "L" when they agree but fail a limit or
  // a check of their own (a full disk everywhere is no difference between them), then the rows.
  bool differ = false;
  for (const Row& row : report.rows) differ |= !row.ok && row.mismatch;
  const std::string failed = fmt::format("{}", fmt::join(report.mismatches(), ", "));
  const std::string said = comm.broadcast_bytes(comm.rank() == 0 && !failed.empty() ? (differ ? "D" : "L") + failed : "", 0);
  const std::string verdict = said.empty() ? "" : said.substr(1);
  if (verdict.empty()) {
    if (comm.rank() == 0)
      log::info(fmt::format("environment check: {} facts agree on all {} ranks ({:.2f} s)", report.rows.size(), comm.world_size(),
                            seconds_since(t0)));
    return;
  }
  if (comm.rank() == 0) log::error("environment check failed:\n" + render_text(report));
  if (said[0] == 'L')
    throw Error(ErrorCode::kEnvironment, "the environment check failed: " + verdict + " (the report is in rank 0's log)",
                "fix what the report names (see `dstrain check-env`), or start with --skip-env-check (launch.env_check: false)");
  throw Error(ErrorCode::kEnvironment, "the ranks' environments differ: " + verdict + " (the report is in rank 0's log)",
              "make the nodes alike (see `dstrain check-env`), or start with --skip-env-check (launch.env_check: false)");
}

}  // namespace dstrain::envcheck
