#pragma once
// preference.reference live (train.objective dpo and kto with LoRA): each micro-batch's reference
// log-probs made when it comes, by the model with its adapters off (model::AdaptersOff: the frozen
// base, as PEFT's disable_adapter gives TRL's reference), through the runner's forward without
// autograd (ZeRO-3 gathers, expert parallelism), so no second copy of the model is kept and no
// file is written. The values are those a precomputed pass over the base would give.
#include <ATen/core/Tensor.h>

#include <vector>

#include "dstrain/model/objective.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::train {

class StepRunner;

class LiveReference {
 public:
  LiveReference(const config::Recipe& recipe, StepRunner& runner, model::CausalLM& model);
  // Sets each batch's reference_logps (one forward per batch; collective as a forward is: every
  // rank calls it with as many batches).
  void fill(std::vector<data::Batch>& batches);

 private:
  const config::Recipe& recipe_;
  StepRunner& runner_;
  model::CausalLM& model_;
};

// An objective that scores nothing and appends each batch's completion log-prob sums (float64
// [rows], LD-DPO's weighted sums with preference.ld_alpha) to `captured`: the reference's pass.
model::Objective reference_capture(const config::Recipe& recipe, std::vector<at::Tensor>& captured);

// Whether `recipe` reads its reference log-probs live (preference.reference live).
bool reads_live_reference(const config::Recipe& recipe);

}  // namespace dstrain::train
