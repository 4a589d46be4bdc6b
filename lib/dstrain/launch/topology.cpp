#include "dstrain/launch/topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

#include "dstrain/core/error.h"

extern char** environ;

namespace dstrain::launch {
namespace {

constexpr int kDefaultPort = 29500;  // torchrun's and DeepSpeed's default master port

const std::string* get(const Environment& env, const std::string& key) {
  const auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int integer(const Environment& env, const std::string& key, int min) {
  const std::string* v = get(env, key);
  if (!v) throw Error(ErrorCode::kUsage, fmt::format("environment variable {} is not set", key), "");
  try {
    size_t used = 0;
    const int n = std::stoi(*v, &used);
    if (used == v->size() && n >= min) return n;
  } catch (const std::exception&) {}
  throw Error(ErrorCode::kUsage, fmt::format("environment variable {}='{}' is not an integer >= {}", key, *v, min),
              "fix the scheduler or launcher environment, or pass explicit flags (--nnodes, --node-rank, ...)");
}

int integer_or(const Environment& env, const std::string& key, int fallback, int min) {
  return get(env, key) ? integer(env, key, min) : fallback;
}

// SLURM_TASKS_PER_NODE (or SLURM_STEP_TASKS_PER_NODE): "4,2,2" or "2(x3),1" -> tasks on each node.
std::vector<int> tasks_per_node(const std::string& spec) {
  std::vector<int> out;
  auto bad = [&] { return Error(ErrorCode::kUsage, fmt::format("SLURM_TASKS_PER_NODE='{}' is not understood", spec), ""); };
  size_t at = 0;
  while (at < spec.size()) {
    size_t used = 0;
    int tasks = 0, times = 1;
    try {
      tasks = std::stoi(spec.substr(at), &used);
    } catch (const std::exception&) {
      throw bad();
    }
    at += used;
    if (at < spec.size() && spec[at] == '(') {  // "(xN)"
      if (spec.compare(at, 2, "(x") != 0) throw bad();
      try {
        times = std::stoi(spec.substr(at + 2), &used);
      } catch (const std::exception&) {
        throw bad();
      }
      at += 2 + used;
      if (at >= spec.size() || spec[at] != ')') throw bad();
      ++at;
    }
    if (tasks < 1 || times < 1 || times > 1000000) throw bad();
    out.insert(out.end(), static_cast<size_t>(times), tasks);
    if (at < spec.size() && spec[at++] != ',') throw bad();
  }
  if (out.empty()) throw bad();
  return out;
}

// The store's port for a Slurm step without MASTER_PORT: derived from the job and step ids, so
// that jobs and steps sharing a node do not collide on one fixed port (10000-59999).
int slurm_port(const Environment& env) {
  const uint64_t job = static_cast<uint64_t>(integer_or(env, "SLURM_JOB_ID", 0, 0));
  const uint64_t step = static_cast<uint64_t>(integer_or(env, "SLURM_STEP_ID", 0, 0));
  return 10000 + static_cast<int>((job * 131 + step * 7919) % 50000);
}

void master_from_env(Topology& t, const Environment& env, const std::string& fallback_addr) {
  t.master_addr = get(env, "MASTER_ADDR") ? *get(env, "MASTER_ADDR") : fallback_addr;
  t.master_port = integer_or(env, "MASTER_PORT", kDefaultPort, 1);
  t.why.push_back(fmt::format("master {}:{} ({})", t.master_addr, t.master_port,
                              get(env, "MASTER_ADDR") ? "MASTER_ADDR/MASTER_PORT" : "default port; set MASTER_ADDR/MASTER_PORT to change"));
}

void check_rank(const Topology& t, const std::string& vars) {
  if (t.rank >= t.world_size || t.local_rank >= t.local_world_size || t.world_size % t.local_world_size != 0)
    throw Error(
        ErrorCode::kUsage,
        fmt::format("inconsistent {}: rank {} of {}, local rank {} of {}", vars, t.rank, t.world_size, t.local_rank, t.local_world_size),
        "every node must run the same number of ranks");
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

// One hostlist item, prefix[ranges]rest, where rest may hold more bracket groups
// ("rack[1-2]-node[01-02]": the first group outermost, as `scontrol show hostnames` lists them).
template <typename Bad>
void expand_item(const std::string& item, const Bad& bad, std::vector<std::string>& hosts) {
  const auto open = item.find('[');
  if (open == std::string::npos) return hosts.push_back(item);
  const auto close = item.find(']', open);
  const std::string prefix = item.substr(0, open), rest = item.substr(close + 1), ranges = item.substr(open + 1, close - open - 1);
  std::vector<std::string> tails;
  expand_item(rest, bad, tails);
  size_t r = 0;
  while (r <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', r), ranges.size());
    const std::string range = ranges.substr(r, comma - r);
    const auto dash = range.find('-');
    const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
        hi.find_first_not_of("0123456789") != std::string::npos || lo.size() > 9 || hi.size() > 9)
      throw bad(fmt::format("range '{}' is not N or N-M", range));
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a) throw bad(fmt::format("range '{}' runs backwards", range));
    if (b - a > 100000) throw bad(fmt::format("range '{}' is too large", range));
    for (long n = a; n <= b; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      for (const std::string& tail : tails) {
        if (hosts.size() >= 1000000) throw bad("more than 1,000,000 hosts");
        hosts.push_back(prefix + digits + tail);
      }
    }
    r = comma + 1;
  }
}

std::vector<std::string> expand_hostlist(const std::string& list) {
  std::vector<std::string> hosts;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kUsage, fmt::format("hostlist '{}' is malformed: {}", list, why), "check SLURM_JOB_NODELIST");
  };
  size_t i = 0;
  while (i < list.size()) {
    // One item: prefix[ranges]suffix, items separated by commas outside brackets.
    size_t end = i;
    int depth = 0;
    while (end < list.size() && (depth > 0 || list[end] != ',')) {
      if (list[end] == '[') ++depth;
      if (list[end] == ']') --depth;
      if (depth < 0 || depth > 1) throw bad("unbalanced or nested brackets");
      ++end;
    }
    if (depth != 0) throw bad("unclosed '['");
    const std::string item = list.substr(i, end - i);
    if (item.empty()) throw bad("empty host name");
    expand_item(item, bad, hosts);
    i = end + 1;
  }
  return hosts;
}

std::string Topology::shared_run_id() const { return job_id.empty() ? fmt::format("static-{}-{}", master_addr, master_port) : job_id; }

std::string Topology::describe() const {
  std::string out = fmt::format("topology from {}: ", source);
  if (mode == Mode::kRank)
    out += fmt::format("this process is rank {} of {} (local rank {} of {}, node {} of {})", rank, world_size, local_rank, local_world_size,
                       node_rank, nnodes);
  else
    out += fmt::format("this launcher starts {} worker{} on node {} of {} ({} ranks in all)", nproc_per_node,
                       nproc_per_node == 1 ? "" : "s", node_rank, nnodes, world());
  out += fmt::format("; rendezvous at {}:{}", master_addr, master_port == 0 ? std::string("(a free port)") : std::to_string(master_port));
  for (const auto& w : why) out += "\n    because: " + w;
  return out;
}

namespace {

// torchrun (or a compatible launcher) made this process one rank.
void rank_from_torchrun(Topology& t, const Environment& env) {
  t.source = "torchrun";
  t.mode = Topology::Mode::kRank;
  t.rank = integer(env, "RANK", 0);
  t.world_size = integer(env, "WORLD_SIZE", 1);
  t.local_rank = integer(env, "LOCAL_RANK", 0);
  t.local_world_size = integer_or(env, "LOCAL_WORLD_SIZE", t.world_size, 1);
  check_rank(t, "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE");
  t.why.push_back("RANK, WORLD_SIZE and LOCAL_RANK are set (torchrun or a compatible launcher): this process runs as that rank");
  master_from_env(t, env, "127.0.0.1");
  // torchrun's agent hosts the store on MASTER_PORT when TORCHELASTIC_USE_AGENT_STORE=True.
  const std::string* agent = get(env, "TORCHELASTIC_USE_AGENT_STORE");
  t.host_store = !(agent && (*agent == "True" || *agent == "true" || *agent == "1")) && t.rank == 0;
  if (const auto* id = get(env, "TORCHELASTIC_RUN_ID")) t.job_id = *id;
  t.restart_count = integer_or(env, "TORCHELASTIC_RESTART_COUNT", 0, 0);
}

void rank_from_plain_env(Topology& t, const Environment& env) {
  // torch's env:// without torchrun (a scheduler's own launcher): no agent, so rank 0 hosts the
  // store; without LOCAL_RANK each process is local rank 0 of its own node.
  t.source = "env://";
  t.mode = Topology::Mode::kRank;
  t.rank = integer(env, "RANK", 0);
  t.world_size = integer(env, "WORLD_SIZE", 1);
  t.local_rank = 0;
  t.local_world_size = 1;
  check_rank(t, "RANK/WORLD_SIZE");
  t.why.push_back(
      "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set without LOCAL_RANK (torch's env://): this process runs as that rank, "
      "alone on its node; rank 0 hosts the rendezvous store");
  master_from_env(t, env, "127.0.0.1");
  t.host_store = t.rank == 0;
}

// Slurm: one task per node (a launcher each) or one task per rank. The step's values come first
// (SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE): a step may run on part of the job's nodes.
void from_slurm(Topology& t, const Environment& env, const LaunchFlags& flags, const std::string& nproc_why) {
  t.source = "slurm";
  const int ntasks = integer(env, "SLURM_NTASKS", 1);
  if (!get(env, "SLURM_STEP_ID") && ntasks > 1)
    throw Error(ErrorCode::kUsage,
                fmt::format("this is the batch script of a Slurm job with {} tasks (SLURM_STEP_ID is not set): dstrain started here would "
                            "be one rank waiting for {} others that nobody starts",
                            ntasks, ntasks - 1),
                "start it through srun in the job script: `srun dstrain train ...` (one task per GPU), or `srun --ntasks-per-node=1 "
                "dstrain train ...` (one launcher per node); README: Slurm");
  const int nnodes =
      integer_or(env, "SLURM_STEP_NUM_NODES", integer_or(env, "SLURM_NNODES", integer_or(env, "SLURM_JOB_NUM_NODES", 1, 1), 1), 1);
  const std::string* nodelist = get(env, "SLURM_STEP_NODELIST") ? get(env, "SLURM_STEP_NODELIST")
                                : get(env, "SLURM_NODELIST")    ? get(env, "SLURM_NODELIST")
                                                                : get(env, "SLURM_JOB_NODELIST");
  const std::string first_host = nodelist ? expand_hostlist(*nodelist).front() : "127.0.0.1";
  const int node = integer_or(env, "SLURM_NODEID", 0, 0);
  if (const auto* id = get(env, "SLURM_JOB_ID"))  // the step too: a second step in one allocation is another run
    t.job_id = "slurm-" + *id + (get(env, "SLURM_STEP_ID") ? "." + *get(env, "SLURM_STEP_ID") : "");
  const int port = flags.master_port >= 0 ? flags.master_port : integer_or(env, "MASTER_PORT", slurm_port(env), 0);
  const std::string port_why = flags.master_port >= 0    ? "--master-port"
                               : get(env, "MASTER_PORT") ? "MASTER_PORT"
                                                         : "derived from SLURM_JOB_ID and SLURM_STEP_ID";
  if (ntasks == nnodes) {  // one task per node: run a launcher on each
    t.nnodes = nnodes;
    t.node_rank = integer_or(env, "SLURM_NODEID", integer(env, "SLURM_PROCID", 0), 0);
    t.why.push_back(fmt::format(
        "Slurm runs one task per node (SLURM_NTASKS = SLURM_NNODES = {}): this task launches the workers of node {}", nnodes, t.node_rank));
    t.why.push_back(fmt::format("{} workers per node ({})", t.nproc_per_node, nproc_why));
  } else {  // one task per GPU: each task is a rank
    t.mode = Topology::Mode::kRank;
    t.rank = integer(env, "SLURM_PROCID", 0);
    t.world_size = ntasks;
    t.local_rank = integer_or(env, "SLURM_LOCALID", 0, 0);
    const std::string* spec =
        get(env, "SLURM_STEP_TASKS_PER_NODE") ? get(env, "SLURM_STEP_TASKS_PER_NODE") : get(env, "SLURM_TASKS_PER_NODE");
    if (spec) {
      const std::vector<int> per_node = tasks_per_node(*spec);
      if (node >= static_cast<int>(per_node.size()))
        throw Error(ErrorCode::kUsage,
                    fmt::format("SLURM_NODEID={} but SLURM_TASKS_PER_NODE='{}' lists {} node(s)", node, *spec, per_node.size()),
                    "fix the scheduler environment, or pass explicit flags");
      t.local_world_size = per_node[static_cast<size_t>(node)];
    } else {
      t.local_world_size = get(env, "SLURM_NTASKS_PER_NODE") ? integer(env, "SLURM_NTASKS_PER_NODE", 1) : ntasks / nnodes;
    }
    // Nodes may run different numbers of tasks ("4,2,2"): the node is Slurm's, not rank / tasks.
    if (t.rank >= t.world_size || t.local_rank >= t.local_world_size)
      throw Error(ErrorCode::kUsage,
                  fmt::format("inconsistent SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID: rank {} of {}, local rank {} of {}", t.rank,
                              t.world_size, t.local_rank, t.local_world_size),
                  "fix the scheduler environment, or pass explicit flags");
    t.nnodes = nnodes;
    t.node_rank = node;
    t.why.push_back(fmt::format("Slurm runs {} tasks on {} node(s): each task is one rank", ntasks, nnodes));
    t.host_store = t.rank == 0;
  }
  t.master_addr = get(env, "MASTER_ADDR") ? *get(env, "MASTER_ADDR") : first_host;
  t.master_port = port;
  t.why.push_back(fmt::format("master {}:{} ({}; port {})", t.master_addr, t.master_port,
                              get(env, "MASTER_ADDR") ? "MASTER_ADDR" : "the first host of the step's nodelist", port_why));
}

}  // namespace

Topology detect_topology(const LaunchFlags& flags, const Environment& env, int recipe_nproc, int recipe_nnodes,
                         const std::string& recipe_master_addr, int recipe_master_port, int visible_gpus) {
  Topology t;
  // Under Slurm, --master-port alone only picks the port; the rest still comes from Slurm.
  const bool slurm = get(env, "SLURM_PROCID") && get(env, "SLURM_NTASKS");
  const bool any_flag = flags.nnodes > 0 || flags.node_rank >= 0 || !flags.master_addr.empty() || (flags.master_port >= 0 && !slurm);
  const int default_nproc = recipe_nproc > 0 ? recipe_nproc : (visible_gpus > 0 ? visible_gpus : 1);
  const std::string nproc_why = flags.nproc_per_node > 0 ? "--nproc-per-node"
                                : recipe_nproc > 0       ? "launch.nproc_per_node in the recipe"
                                : visible_gpus > 0       ? fmt::format("{} visible GPUs", visible_gpus)
                                                         : "default: 1 without GPUs";
  t.nproc_per_node = flags.nproc_per_node > 0 ? flags.nproc_per_node : default_nproc;

  if (any_flag) {
    t.source = "flags";
    t.nnodes = flags.nnodes > 0 ? flags.nnodes : recipe_nnodes;
    t.node_rank = flags.node_rank >= 0 ? flags.node_rank : 0;
    t.master_addr = !flags.master_addr.empty() ? flags.master_addr : recipe_master_addr;
    t.master_port = flags.master_port >= 0 ? flags.master_port : recipe_master_port;
    t.why.push_back("explicit --nnodes/--node-rank/--master-addr/--master-port flags take precedence over any environment");
    t.why.push_back(fmt::format("{} workers per node ({})", t.nproc_per_node, nproc_why));
  } else if (get(env, "RANK") && get(env, "WORLD_SIZE") && get(env, "LOCAL_RANK")) {
    rank_from_torchrun(t, env);
  } else if (get(env, "RANK") && get(env, "WORLD_SIZE") && get(env, "MASTER_ADDR") && get(env, "MASTER_PORT")) {
    rank_from_plain_env(t, env);
  } else if (slurm) {
    from_slurm(t, env, flags, nproc_why);
  } else if (get(env, "OMPI_COMM_WORLD_RANK") && get(env, "OMPI_COMM_WORLD_SIZE")) {
    t.source = "openmpi";
    t.mode = Topology::Mode::kRank;
    t.rank = integer(env, "OMPI_COMM_WORLD_RANK", 0);
    t.world_size = integer(env, "OMPI_COMM_WORLD_SIZE", 1);
    t.local_rank = integer_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", t.rank, 0);
    t.local_world_size = integer_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", t.world_size, 1);
    check_rank(t, "OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE");
    t.why.push_back("OMPI_COMM_WORLD_RANK/SIZE are set (mpirun): each process is one rank");
    master_from_env(t, env, "127.0.0.1");
    t.host_store = t.rank == 0;
    if (const auto* id = get(env, "OMPI_MCA_ess_base_jobid")) t.job_id = "ompi-" + *id;
  } else if (get(env, "PMI_RANK") && get(env, "PMI_SIZE")) {
    t.source = "pmi";
    t.mode = Topology::Mode::kRank;
    t.rank = integer(env, "PMI_RANK", 0);
    t.world_size = integer(env, "PMI_SIZE", 1);
    t.local_rank = integer_or(env, "MPI_LOCALRANKID", integer_or(env, "PMI_LOCAL_RANK", t.rank, 0), 0);
    t.local_world_size = integer_or(env, "MPI_LOCALNRANKS", integer_or(env, "PMI_LOCAL_SIZE", t.world_size, 1), 1);
    check_rank(t, "PMI_RANK/PMI_SIZE");
    t.why.push_back("PMI_RANK/PMI_SIZE are set (an MPI launcher with PMI): each process is one rank");
    master_from_env(t, env, "127.0.0.1");
    t.host_store = t.rank == 0;
  } else {
    t.source = "recipe";
    t.nnodes = recipe_nnodes;
    t.node_rank = 0;
    t.master_addr = recipe_master_addr;
    t.master_port = recipe_master_port;
    t.why.push_back("no flags and no torchrun, Slurm, OpenMPI or PMI environment: one launcher per the recipe's launch section");
    t.why.push_back(fmt::format("{} workers per node ({})", t.nproc_per_node, nproc_why));
  }

  if (t.mode == Topology::Mode::kRank) {
    t.nproc_per_node = t.local_world_size;
    if (t.source != "slurm") t.nnodes = t.world_size / t.local_world_size, t.node_rank = t.rank / t.local_world_size;
  }
  if (t.node_rank >= t.nnodes)
    throw Error(ErrorCode::kUsage, fmt::format("node rank {} is not below the number of nodes {}", t.node_rank, t.nnodes),
                "check --node-rank and --nnodes");
  if (t.nnodes > 1 && t.mode == Topology::Mode::kLauncher && t.master_port == 0)
    throw Error(ErrorCode::kUsage, fmt::format("{} nodes need a fixed rendezvous port: every node must know it in advance", t.nnodes),
                "pass --master-port (e.g. 29500) to every node's launcher, or set launch.master_port");
  if (t.nnodes > 1 && t.mode == Topology::Mode::kLauncher && (t.master_addr == "127.0.0.1" || t.master_addr == "localhost"))
    t.why.push_back("warning: several nodes with master 127.0.0.1 only work when all 'nodes' are this host");
  return t;
}

}  // namespace dstrain::launch
