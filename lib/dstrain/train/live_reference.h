#pragma once
// preference.reference live (train.objective dpo and kto): each micro-batch's reference log-probs
// made when it comes, so no file is written. Two kinds:
// - with LoRA, the model itself with its adapters off (model::AdaptersOff: the frozen base, as
//   PEFT's disable_adapter gives TRL's reference), through the training runner's forward without
//   autograd (ZeRO-3 gathers, expert parallelism), so no second copy of the model is kept;
// - without, a frozen copy of the starting model (model.seed, model.init_from: made again on a
//   resume, checkpoints naming model.init_from's files), as TRL's create_reference_model keeps one,
//   in its own ZeRO engine's frozen domain (at stage 3 each rank holds its shard of it).
// The values are those a precomputed pass over the starting model would give.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "dstrain/model/objective.h"
#include "dstrain/model/stateful.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::comm {
class Communicator;
}
namespace dstrain::zero {
class Engine;
}
namespace dstrain::train {

class StepRunner;

// The names a moving copy's tensors have in a checkpoint: this, then the parameter's.
inline constexpr char kReferenceCopyPrefix[] = "preference.reference_copy.";

class LiveReference {
 public:
  // With LoRA: `runner` forwards `model` with its adapters off. Both borrowed.
  LiveReference(const config::Recipe& recipe, StepRunner& runner, model::CausalLM& model);
  // A frozen copy (frozen_starting_model) and the engine that holds its parameters (null: no ZeRO,
  // as dstrain eval runs), owned.
  LiveReference(const config::Recipe& recipe, std::unique_ptr<model::CausalLM> copy, std::unique_ptr<zero::Engine> engine,
                const c10::Device& device);
  ~LiveReference();
  // Sets each batch's reference_logps (one forward per batch; collective as a forward is: every
  // rank calls it with as many batches).
  void fill(std::vector<data::Batch>& batches);
  // The copy's engine (null with LoRA or without ZeRO).
  zero::Engine* copy_engine() { return engine_.get(); }
  // After `steps_done` steps: TR-DPO's sync (preference.sync_ref_model) when steps_done is a
  // multiple of preference.ref_model_sync_steps, the copy mixed with `policy`'s parameters as
  // TRL's SyncRefModelCallback does at a step's end (before that step's evaluation and save).
  // Collective. Returns whether it synced.
  bool after_step(const zero::Engine& policy, int64_t steps_done);

 private:
  const config::Recipe& recipe_;
  std::unique_ptr<model::CausalLM> copy_;  // declared before what reads it: destroyed after
  std::unique_ptr<zero::Engine> engine_;
  std::unique_ptr<model::Objective> unused_;  // the copy's runner's own objective (forward_with passes the reference's)
  std::unique_ptr<StepRunner> own_runner_;
  StepRunner& runner_;
  model::CausalLM& model_;
};

// The starting model as a run makes it (model.seed, then model.init_from's weights), every
// parameter frozen, its buffers on `device`; its parameters stay on the CPU for an engine to take
// (or for the caller to move). expert_group: as the policy's.
std::unique_ptr<model::CausalLM> frozen_starting_model(const config::Recipe& recipe, comm::Communicator* expert_group,
                                                       const c10::Device& device);

// What a frozen copy is made from (reference_model_identity's SHA-256), saved with every
// checkpoint: a resume makes the copy again from model.init_from and must make the same one, so a
// folder whose weights changed since is refused (Error{kCheckpoint}) instead of silently giving
// another reference. Older checkpoints lack it and resume unchecked.
class ReferenceIdentity final : public model::Stateful {
 public:
  // Rank 0 reads model.init_from's files; every rank learns the identity. Collective over `comm`.
  ReferenceIdentity(const config::Recipe& recipe, comm::Communicator& comm);
  model::NamedTensors state() const override;
  void load_state(const model::NamedTensors& state) override;
  bool state_optional() const override { return true; }

 private:
  at::Tensor sha256_;  // float32 [32]: the digest's bytes
  std::string made_from_;
};

}  // namespace dstrain::train
