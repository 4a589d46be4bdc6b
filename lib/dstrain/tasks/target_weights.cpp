#include "dstrain/tasks/target_weights.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/peft_import.h"
#include "dstrain/model/quantized_base.h"

namespace dstrain::tasks {

void load_checkpoint_weights(const std::string& dir, const model::NamedTensors& tensors) {
  const ckpt::Reader reader(dir, /*verified=*/true);
  for (const auto& t : tensors) {
    const ckpt::TensorMeta* m = reader.find(t.name);
    if (!m) continue;  // a buffer that older checkpoints lack: the model's default stays
    at::Tensor host = at::empty(m->shape, m->dtype == "float64" ? at::kDouble : at::kFloat);
    reader.read(t.name, 0, m->numel(), host.data_ptr(), m->dtype);
    t.tensor.copy_(host);
  }
}

// The model in the recipe's dtype with the target's weights, on `device`; no engine. A LoRA run's
// adapters are attached as the run attached them: on the base's weights (DoRA's magnitudes start
// from them), then its lora.init_from, or before the checkpoint that holds them (and the base, when
// the run had no model.init_from).
void load_target_weights(model::CausalLM& model, const config::Recipe& recipe, const std::string& checkpoint, const c10::Device& device) {
  c10::NoGradGuard no_grad;
  const auto attach = [&] {
    if (recipe.lora.enabled()) model::attach_lora(model, model::lora_spec_of(recipe.lora), recipe.seed);
  };
  if (checkpoint.empty()) {
    model::load_hf_weights(recipe.model.init_from, recipe.model, model.parameters(), model.buffers());
    attach();
    if (!recipe.lora.init_from.empty()) model::load_peft_adapter(model, recipe);
  } else {
    // A LoRA checkpoint names its base (the launcher checked it is model.init_from's files).
    if (model::lora_checkpoints_name_base(recipe))
      model::load_hf_weights(recipe.model.init_from, recipe.model, model.parameters(), model.buffers());
    attach();
    load_checkpoint_weights(checkpoint, model.parameters());
    load_checkpoint_weights(checkpoint, model.buffers());
  }
  // A quantized base (lora.base) as the run kept it: quantized from the loaded weights, on the device.
  if (recipe.lora.enabled()) model::quantize_base(model, recipe, device);  // nothing for lora.base: model
  // set_data keeps every handle the model holds pointing at the moved tensor.
  for (const auto& p : model.parameters()) p.tensor.set_data(p.tensor.to(device));
  model.move_buffers_to(device);
}

}  // namespace dstrain::tasks
