#pragma once
// Collectives between the ranks of a run. Small on purpose; issue 4 grows it into async handles,
// reduce-scatter/all-gather and NCCL. Every call blocks until done or until the timeout, and a
// failure throws Error{kComm} naming the op, its sequence number and the rank.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>

namespace dstrain::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over ranks of a contiguous fp32 CPU tensor.
  virtual void all_reduce_sum(at::Tensor& tensor) = 0;
  // In-place copy of root's tensor to every rank.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
};

struct Endpoint {
  std::string master_addr;
  int master_port;
  std::string run_id;  // a worker of another run or restart generation is refused
  std::chrono::milliseconds timeout;
};

// Joins the launcher's store and builds a Gloo group over it.
std::unique_ptr<Communicator> make_gloo_communicator(const Endpoint& endpoint, int rank, int world_size);

}  // namespace dstrain::comm
