#include "dstrain/train/live_reference.h"

#include <ATen/ATen.h>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/linear.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "dstrain/train/step_runner.h"

namespace dstrain::train {

LiveReference::LiveReference(const config::Recipe& recipe, StepRunner& runner, model::CausalLM& model)
    : recipe_(recipe), runner_(runner), model_(model) {}

model::Objective reference_capture(const config::Recipe& recipe, std::vector<at::Tensor>& captured) {
  model::Objective reference;
  const model::CompletionOptions options{recipe.train.loss_chunk_tokens, recipe.preference.ld_alpha};
  reference.set_sequence_loss({}, [&captured, options](const model::CausalLM&, const model::CausalLM::Hidden& h, const data::Batch& batch) {
    const at::Tensor logps = model::completion_logps(h, batch, options).logps;
    captured.push_back(logps.to(at::kDouble));
    return model::SequenceLossValue{at::zeros({}, logps.options()), {}};
  });
  return reference;
}

void LiveReference::fill(std::vector<data::Batch>& batches) {
  std::vector<at::Tensor> captured;
  const model::Objective reference = reference_capture(recipe_, captured);
  {
    model::AdaptersOff off;
    runner_.forward_with(reference, batches);
  }
  // The reference's forward is no part of the step's expert load or all-to-all waits.
  model_.take_expert_load();
  model_.take_all_to_all_wait_ms();
  if (captured.size() != batches.size())
    throw Error(ErrorCode::kInternal, "the live reference pass scored another number of micro-batches", "report this as a bug");
  for (size_t i = 0; i < batches.size(); ++i) batches[i].reference_logps = captured[i].to(at::kCPU);
}

bool reads_live_reference(const config::Recipe& r) {
  return (r.train.objective == config::TrainObjective::kDpo || r.train.objective == config::TrainObjective::kKto) &&
         r.preference.reference == "live";
}

}  // namespace dstrain::train
