#pragma once
// Collectives between the ranks of a run. Every op is asynchronous and returns a Work handle;
// wait() blocks until the op is done or its timeout passes, and a failure throws Error{kComm}
// naming the op, its sequence number and the rank. All ranks must issue the same ops in the same
// order. Tensors must be contiguous (checked: Gloo silently gives wrong results otherwise).
// Supported dtypes: float32, bfloat16 and float16 (the 16-bit ones are reduced in fp32).
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::run {
struct WorkerEnv;
}

namespace dstrain::comm {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; throws Error{kComm} on failure or timeout. Idempotent.
  virtual void wait() = 0;
  // True once the op is known to have completed (never blocks; a failure shows in wait()). Gloo
  // knows only after wait(); NCCL asks its event.
  virtual bool done() = 0;
};
using WorkHandle = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo" or "nccl"
  virtual at::Device device() const = 0;    // where its tensors live (CPU for Gloo, a GPU for NCCL)

  // In-place sum over ranks.
  virtual WorkHandle all_reduce(at::Tensor& tensor) = 0;
  // input holds world_size equal chunks; output (one chunk) receives the sum over ranks of chunk
  // `rank`. Moves (N-1)/N of the input per rank: never an all-reduce followed by a slice.
  virtual WorkHandle reduce_scatter(const at::Tensor& input, at::Tensor& output) = 0;
  // output (world_size chunks) receives every rank's input, in rank order.
  virtual WorkHandle all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // In-place copy of root's tensor to every rank.
  virtual WorkHandle broadcast(at::Tensor& tensor, int root) = 0;
  virtual WorkHandle barrier() = 0;
  // Point to point (the pairwise link probe of check-env): the whole tensor to/from one rank.
  virtual WorkHandle send(const at::Tensor& tensor, int dst) = 0;
  virtual WorkHandle recv(at::Tensor& tensor, int src) = 0;
  // Every rank's bytes, in rank order (blocking): for facts such as versions and hostnames.
  virtual std::vector<std::string> all_gather_bytes(const std::string& mine) = 0;
  // Every rank's bytes to `root` only (the others get an empty vector); blocks every rank until
  // the root has them. For what one rank reads (checkpoint summaries, environment facts): at scale
  // an all-gather would send them into every rank (issue 26). Gloo and NCCL go through the store.
  virtual std::vector<std::string> gather_bytes(const std::string& mine, int root) = 0;
  // root's bytes to every rank (a length, then the payload, over broadcast: a tree, not a gather).
  std::string broadcast_bytes(const std::string& bytes, int root);

  // Uneven all-to-all over dim 0 (MoE's token dispatch): rows [sum(send_rows[0..r)), +send_rows[r])
  // of input go to rank r; output receives recv_rows[r] rows from rank r, in rank order. Rows of
  // input and output have one shape and dtype. Counts must agree pairwise (what rank a sends to b
  // is what b receives from a): exchange_counts() gives recv_rows from send_rows. Data only, bit
  // for bit; zero counts are allowed (a rank may send or receive nothing).
  virtual WorkHandle all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows) = 0;

  // The groups of a partition of this communicator's ranks, each a communicator of its own (expert
  // parallelism: the ranks that exchange tokens, and the ranks that hold one expert's replicas).
  // Every rank calls it with the same partition, in the same order relative to its other ops; each
  // gets the group it is in, ranked by its position in that group's list. Blocks until the group
  // is formed. A partition that misses or repeats a rank is refused.
  virtual std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups) = 0;
};

// The row counts each rank receives from every rank, given what this rank sends to each (one
// all-to-all of world_size integers): the first half of an uneven exchange.
std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send_rows);

// Sums `host` (a tensor in host memory) over ranks in place, through the communicator's device
// (a GPU for NCCL, which takes no host tensors). Collective.
void all_reduce_host(Communicator& comm, at::Tensor& host);

// The sum over ranks of a non-negative count below 2^48, exact (float32 all-reduces round
// above 2^24: the count travels as six 8-bit digits, exact up to 65,536 ranks). Collective.
int64_t sum_exactly(Communicator& comm, int64_t value);
// The same for several counts in one all-reduce.
std::vector<int64_t> sum_exactly(Communicator& comm, const std::vector<int64_t>& values);
// Sums of doubles over ranks, added in rank order on every rank (one all-gather of two floats per
// value and rank, about 48 bits of each): the same result at every rank and from every launch,
// whatever a reduction tree would do. For rare, small sums (the validation loss and its tokens).
std::vector<double> sum_in_rank_order(Communicator& comm, const std::vector<double>& values);

// This rank's group in `groups` and its position there; throws Error{kInternal} (naming the rank)
// when `groups` is not a partition of 0..world-1. For split()'s implementations.
struct GroupPlace {
  int index;  // which group
  int rank;   // position in it
};
GroupPlace place_in_partition(const std::vector<std::vector<int>>& groups, int rank, int world);

// Expert parallelism's two partitions of `world` ranks for an expert-parallel size E that divides
// it: `parallel`, E consecutive ranks each (they exchange tokens and share one layer's experts);
// `data`, every E-th rank (they hold the same experts and reduce their gradients).
struct ExpertPartitions {
  std::vector<std::vector<int>> parallel, data;
};
ExpertPartitions expert_partitions(int world, int expert_parallel_size);

// Both groups split from `comm` (a collective, as split() is); none when E <= 1.
struct ExpertCommunicators {
  std::unique_ptr<Communicator> parallel, data;
};
ExpertCommunicators split_expert_groups(Communicator& comm, int expert_parallel_size);

// Checks all_to_all's arguments against the communicator's size and the tensors (a dstrain bug
// otherwise): counts per rank, non-negative, summing to the tensors' row counts.
void check_all_to_all(const at::Tensor& input, const at::Tensor& output, const std::vector<int64_t>& send_rows,
                      const std::vector<int64_t>& recv_rows, int world);

struct Endpoint {
  std::string master_addr;
  int master_port;
  std::string run_id;  // a worker of another run or restart generation is refused
  std::chrono::milliseconds timeout;
  bool host_store = false;                          // this rank hosts the store (no dstrain launcher: mpirun, srun)
  std::chrono::milliseconds collective_timeout{0};  // a collective's wait; 0: `timeout`
  bool publish_run_id = false;  // no dstrain launcher: write the run id unless the store has one (torchrun's agent store)
};

// A worker's endpoint: its store, run key and role in the rendezvous (run/worker_env.h).
Endpoint endpoint_of(const run::WorkerEnv& env, std::chrono::milliseconds timeout, std::chrono::milliseconds collective_timeout = {});

// Joins (or hosts) the store, announces this rank, and builds a Gloo group. A timeout names the
// ranks that never arrived.
std::unique_ptr<Communicator> make_gloo_communicator(const Endpoint& endpoint, int rank, int world_size);

// Whether Gloo's pairs connect on first use (the default) rather than as a full mesh at setup
// (DSTRAIN_GLOO_FULL_MESH=1, PyTorch's default).
bool gloo_connects_lazily();

// The same over NCCL on GPU `device_index` (nccl.h directly: the unique id travels through the
// store; waits poll for completion and NCCL's async errors, and abort the communicator on
// timeout). Throws Error{kEnvironment} when dstrain was built without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(const Endpoint& endpoint, int rank, int world_size, int device_index);
bool nccl_available();

}  // namespace dstrain::comm
