#include "dstrain/train/live_reference.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dstrain/config/recipe.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/sha256.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/linear.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/train/reference_logps.h"
#include "dstrain/train/sequential_runner.h"
#include "dstrain/train/step_runner.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {

LiveReference::LiveReference(const config::Recipe& recipe, StepRunner& runner, model::CausalLM& model)
    : recipe_(recipe), runner_(runner), model_(model) {}

LiveReference::LiveReference(const config::Recipe& recipe, std::unique_ptr<model::CausalLM> copy, std::unique_ptr<zero::Engine> engine,
                             const c10::Device& device)
    : recipe_(recipe), copy_(std::move(copy)), engine_(std::move(engine)),
      unused_(std::make_unique<model::Objective>(recipe.train.loss_chunk_tokens)),
      own_runner_(std::make_unique<SequentialRunner>(*copy_, *unused_, engine_.get(), device)), runner_(*own_runner_), model_(*copy_) {}

LiveReference::~LiveReference() = default;

std::unique_ptr<model::CausalLM> frozen_starting_model(const config::Recipe& r, comm::Communicator* expert_group,
                                                       const c10::Device& device) {
  auto m = model::make_model(r.model, r.seed, model::scalar_type(r.precision.dtype), expert_group);
  if (!r.model.init_from.empty()) model::load_hf_weights(r.model.init_from, r.model, m->parameters(), m->buffers());
  for (size_t i = 0; i < m->parameters().size(); ++i) m->freeze(i);
  m->move_buffers_to(device);
  return m;
}

void LiveReference::fill(std::vector<data::Batch>& batches) {
  std::vector<at::Tensor> captured;
  const model::Objective reference = reference_capture(recipe_, captured);
  {
    model::AdaptersOff off;  // a copy has none
    runner_.forward_with(reference, batches);
  }
  // The reference's forward is no part of the step's expert load or all-to-all waits.
  model_.take_expert_load();
  model_.take_all_to_all_wait_ms();
  if (captured.size() != batches.size())
    throw Error(ErrorCode::kInternal, "the live reference pass scored another number of micro-batches", "report this as a bug");
  for (size_t i = 0; i < batches.size(); ++i) batches[i].reference_logps = captured[i].to(at::kCPU);
}

bool LiveReference::after_step(const zero::Engine& policy, int64_t steps_done) {
  const config::PreferenceConfig& p = recipe_.preference;
  if (!p.sync_ref_model || !engine_ || steps_done % p.ref_model_sync_steps != 0) return false;
  engine_->mix_from(policy, p.ref_model_mixup_alpha);
  return true;
}

ReferenceIdentity::ReferenceIdentity(const config::Recipe& r, comm::Communicator& comm)
    : made_from_(r.model.init_from.empty() ? "model.seed" : r.model.init_from) {
  std::string digest;
  if (comm.rank() == 0) {
    const Sha256Digest sha = sha256(reference_model_identity(r));
    digest.assign(sha.begin(), sha.end());
  }
  digest = comm.broadcast_bytes(digest, 0);
  // Checkpoints hold float tensors: each byte as a float32, exactly.
  sha256_ = at::empty({static_cast<int64_t>(digest.size())}, at::kFloat);
  for (size_t i = 0; i < digest.size(); ++i) sha256_.data_ptr<float>()[i] = static_cast<float>(static_cast<uint8_t>(digest[i]));
}

model::NamedTensors ReferenceIdentity::state() const { return {{"preference.reference_identity.sha256", sha256_}}; }

void ReferenceIdentity::load_state(const model::NamedTensors& state) {
  if (state.empty()) return;  // a checkpoint from before copies were checked
  if (!at::equal(state.front().tensor.to(at::kFloat), sha256_))
    throw Error(ErrorCode::kCheckpoint,
                fmt::format("the checkpoint's reference model (preference.reference live: a frozen copy of the starting model) was made "
                            "from other weights or another model section, seed or dtype than {} gives now",
                            made_from_),
                "resume with model.init_from's files as the run started with them; or start a new run");
}

}  // namespace dstrain::train
