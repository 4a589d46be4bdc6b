#pragma once
// The training run's side of checkpoints: which rank writes what, the commit protocol over the
// communicator, and loading a checkpoint (at any world size or ZeRO stage) into the engine.
//   shared filesystem (every rank sees the checkpoint directory, probed at start): each rank
//     writes its ZeRO shard (master weights and Adam moments by global element ranges) into
//     rank_NNNNN.bin; rank 0 also the replicated state; rank 0 commits when all are done
//   otherwise (nodes with separate disks): rank 0 gathers the full state and writes it alone
// checkpoint.async (shared filesystem only): each rank copies its pieces into host memory and a
// background thread writes them; rank 0's thread commits once every rank's summary file is there.
// At most one save is pending: the next one, and finish(), wait for it.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dstrain/model/named_tensor.h"
#include "dstrain/model/stateful.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::zero {
class Engine;
}
namespace dstrain::ckpt {
class Reader;
struct BaseModel;
struct ShardTable;
struct TrainState;
struct TensorMeta;
struct PieceView;
}  // namespace dstrain::ckpt

namespace dstrain::train {

class Checkpointer {
 public:
  // The engine's sharded tensors, and the replicated state of the engine (engine.state) and of
  // `replicated` (model buffers, data shares): every rank holds it alike; rank 0 saves it. The
  // Stateful objects must outlive the Checkpointer.
  Checkpointer(const config::Recipe& recipe, std::string ckpt_dir, comm::Communicator& comm, zero::Engine& engine,
               std::vector<model::Stateful*> replicated, std::string run_id);
  ~Checkpointer();
  // Pipeline parallelism: the state each stage holds its own part of (the model's buffers of its
  // layers, under global names), saved by one rank per stage (`writer`: the stage's first
  // data-parallel rank). Every rank's engine then holds other tensors: rank 0 gathers their
  // names for the manifest, which lists every rank's pieces. Saves are synchronous. Call before
  // the first save or resume; the objects must outlive the Checkpointer.
  struct StageState {
    std::vector<model::Stateful*> states;
    bool writer = false;
  };
  void set_stage_state(StageState stage);
  // A second engine saved and loaded beside the first, its tensors under `prefix` and sharded as
  // it keeps them (the frozen reference copy of preference.sync_ref_model, which moves). A
  // checkpoint without them leaves it as it is. Call before the first save or resume.
  void add_copy(zero::Engine& copy, std::string prefix);
  // Collective: saves step `step` with the data cursor; returns the directory (async: where it
  // will be once committed).
  std::string save(int64_t step, int64_t samples_consumed);
  // Waits for a pending asynchronous save; rethrows its error.
  void finish();
  bool async() const { return async_; }
  // checkpoint.keep_best: the step whose checkpoint is never pruned (and which `best` names once
  // its checkpoint is committed); -1: none.
  void set_best_step(int64_t step) { best_step_ = step; }
  struct Resumed {
    std::string dir;
    int64_t step = 0;
    int64_t samples_consumed = 0;
  };
  // Collective: loads the newest checkpoint that verifies (rank 0 chooses and says which it
  // skipped and why) into the engine and the replicated tensors.
  // `from`: another run's checkpoint directory or ckpt/ root (train --resume PATH); empty: ours.
  Resumed resume(const std::string& from = "");

 private:
  // Opens `dir` and checks this rank's share of its files; returns what is wrong ("" if nothing).
  std::string verify_share(const std::string& dir, std::unique_ptr<ckpt::Reader>& reader) const;
  const config::Recipe& recipe_;
  std::string dir_;
  comm::Communicator& comm_;
  zero::Engine& engine_;
  std::vector<model::Stateful*> replicated_;  // the engine first
  std::unique_ptr<StageState> stage_;         // pipeline parallelism only
  zero::Engine* copy_ = nullptr;              // add_copy's, saved under copy_prefix_
  std::string copy_prefix_;
  // A LoRA run on a Hugging Face base (model::lora_checkpoints_name_base): the base its
  // checkpoints name, identified by rank 0 and known to every rank; null otherwise.
  std::shared_ptr<const ckpt::BaseModel> base_;
  void identify_base();
  void check_base(const ckpt::Reader& reader, const std::string& dir) const;
  void load_copy(const ckpt::Reader& reader, const std::string& dir);  // collective
  // Rank 0: every rank's tensors (pipeline parallelism: each holds other ones), in rank order.
  std::vector<ckpt::TensorMeta> all_ranks_metas(const std::vector<ckpt::TensorMeta>& mine) const;
  ckpt::TrainState train_state(int64_t step, int64_t samples_consumed) const;
  std::string save_in_background(int64_t step, int64_t samples_consumed, const std::string& staging,
                                 const std::vector<ckpt::TensorMeta>& metas, const std::vector<ckpt::PieceView>& pieces,
                                 std::shared_ptr<const ckpt::ShardTable> table);
  bool shared_ = true;
  bool async_ = false;
  int64_t best_step_ = -1;
  std::thread writer_;
  std::exception_ptr writer_error_;
};

}  // namespace dstrain::train
