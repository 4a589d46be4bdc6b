#pragma once
// The weights `dstrain eval` and `dstrain generate` read into a model built from a target's
// recipe (tasks/eval_target.h): a checkpoint's fp32 master weights, or a Hugging Face folder's,
// with a LoRA run's adapters attached as the run attached them. No engine, no optimizer state.
#include <c10/core/Device.h>

#include <string>

#include "dstrain/model/named_tensor.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
class CausalLM;
}

namespace dstrain::tasks {

// The checkpoint's tensors of these names into them, rounded to their dtype as the engine rounds
// the master weights it publishes; a name the checkpoint lacks keeps its value (a buffer older
// checkpoints lack). The launcher verified the files and checked the names and shapes.
void load_checkpoint_weights(const std::string& dir, const model::NamedTensors& tensors);

// checkpoint: a checkpoint directory, or "" for model.init_from (a Hugging Face folder). The
// model ends on `device`, its buffers too.
void load_target_weights(model::CausalLM& model, const config::Recipe& recipe, const std::string& checkpoint, const c10::Device& device);

}  // namespace dstrain::tasks
