#pragma once
// lora.init_from: a PEFT LoRA adapter read into a model whose adapters are attached (after
// attach_lora, before the engine): every adapter and module to save it holds, by PEFT's key
// (base_model.model.<name>); B's rows and the saved modules' back from the released RoPE layout
// of V2/V3 (the export's inverse). F32, BF16 and F16 are widened. The routed experts' adapters as
// PEFT under transformers 5 saves them (fused, target_parameters) are split per expert.
#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"

namespace dstrain::model {

// Throws Error{kCheckpoint} naming the file and a key it lacks, a shape that differs from the
// attached adapter's, or an adapter tensor of the file that this run's lora.targets do not attach.
void load_peft_adapter(CausalLM& model, const config::Recipe& recipe);

}  // namespace dstrain::model
