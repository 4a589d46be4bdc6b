#pragma once
// The training run's side of checkpoints: which rank writes what, the commit protocol over the
// communicator, and loading a checkpoint (at any world size or ZeRO stage) into the engine.
//   shared filesystem (every rank sees the checkpoint directory, probed at start): each rank
//     writes its ZeRO shard (master weights and Adam moments by global element ranges) into
//     rank_NNNNN.bin; rank 0 also the replicated state; rank 0 commits when all are done
//   otherwise (nodes with separate disks): rank 0 gathers the full state and writes it alone
#include <cstdint>
#include <memory>
#include <string>

#include "dstrain/model/named_tensor.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::zero {
class Engine;
}

namespace dstrain::train {

class Checkpointer {
 public:
  // `replicated`: state every rank holds alike (model buffers, data shares), saved by rank 0.
  Checkpointer(const config::Recipe& recipe, std::string ckpt_dir, comm::Communicator& comm, zero::Engine& engine, model::NamedTensors replicated,
               std::string run_id);
  ~Checkpointer();
  // Collective: saves step `step` with the data cursor; returns the directory (on every rank).
  std::string save(int64_t step, int64_t samples_consumed);
  struct Resumed {
    std::string dir;
    int64_t step = 0;
    int64_t samples_consumed = 0;
  };
  // Collective: loads the newest checkpoint that verifies (rank 0 chooses and says which it
  // skipped and why) into the engine and the replicated tensors.
  // `from`: another run's checkpoint directory or ckpt/ root (train --resume PATH); empty: ours.
  Resumed resume(const std::string& from = "");
  bool shared_filesystem() const { return shared_; }

 private:
  const config::Recipe& recipe_;
  std::string dir_;
  comm::Communicator& comm_;
  zero::Engine& engine_;
  model::NamedTensors replicated_;
  bool shared_ = true;
};

}  // namespace dstrain::train
