#pragma once
// Who is who in a job, decided from the first source that applies:
//   1. explicit flags (--nnodes --node-rank --master-addr --master-port --nproc-per-node)
//   2. a torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK/...): this process is that rank
//   3. Slurm (SLURM_PROCID/LOCALID/NTASKS/NODEID/JOB_NODELIST): one task per node runs a
//      launcher per node; one task per GPU makes each task a rank
//   4. OpenMPI (OMPI_COMM_WORLD_*): each process is a rank
//   5. PMI (PMI_RANK/PMI_SIZE): each process is a rank
//   6. the recipe's launch section (one node)
#include <map>
#include <string>
#include <vector>

namespace dstrain::launch {

using Environment = std::map<std::string, std::string>;
Environment current_environment();

struct LaunchFlags {  // unset: 0 / -1 / ""
  int nnodes = 0;
  int node_rank = -1;
  int nproc_per_node = 0;
  std::string master_addr;
  int master_port = -1;
};

struct Topology {
  // kLauncher: this process starts nproc_per_node workers for node `node_rank`.
  // kRank: this process is one rank (started by torchrun, srun per GPU, mpirun, PMI).
  enum class Mode { kLauncher, kRank } mode = Mode::kLauncher;
  std::string source;            // "flags", "torchrun", "env://", "slurm", "openmpi", "pmi", "recipe"
  std::vector<std::string> why;  // how it was decided, for --dry-run
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: the launcher picks a free one (single node only)
  // kRank only:
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  bool host_store = false;  // this rank hosts the store (no agent store)
  std::string job_id;       // from the scheduler, when it gives one
  int restart_count = 0;    // torchrun's restarts of the group (TORCHELASTIC_RESTART_COUNT)

  int world() const { return nnodes * nproc_per_node; }
  // kRank: the run id every rank derives alike (the scheduler's job id, else the master address).
  std::string shared_run_id() const;
  std::string describe() const;
};

// recipe_nproc/recipe_nnodes/recipe_master_*: the recipe's launch section; visible_gpus: the
// default workers per node when neither flags nor recipe say. Throws Error{kUsage} on
// inconsistent input, naming the variables.
Topology detect_topology(const LaunchFlags& flags, const Environment& env, int recipe_nproc, int recipe_nnodes,
                         const std::string& recipe_master_addr, int recipe_master_port, int visible_gpus);

// Slurm hostlist expansion: "node[01-04,07],gpu-a[1-2]x,login" -> node01 node02 node03 node04
// node07 gpu-a1x gpu-a2x login. Zero padding is kept. Throws Error{kUsage} when malformed.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

}  // namespace dstrain::launch
