#pragma once
// What a launcher refuses before any worker starts, with what to change: settings the training
// engine cannot run yet (no silent "auto" surprises), and a model state that cannot fit in this
// node's host memory or in its GPUs (instead of the kernel's OOM killer or a CUDA OOM later).
namespace dstrain::config {
struct Recipe;
}

namespace dstrain::launch {

// model.init_from: every tensor of the model in the weights' safetensors headers, with its shape
// (read without loading; a 671B model is checked in a second). Throws Error{kCheckpoint}.
void refuse_mismatched_init_weights(const config::Recipe& recipe);
// lora.base nf4 | fp8 quantizes model.init_from's weights: training without it is refused
// (Error{kConfig}); --dry-run plans such a recipe without the weights (a 671B plan needs none).
void refuse_quantized_base_without_weights(const config::Recipe& recipe);
// eval.tasks and eval.samples read and tokenized as the workers will (train::read_eval_tasks,
// train::SampleWriter): a bad row is refused by file:line (Error{kData}), a run without a tokenizer
// for its tasks by key (Error{kConfig}).
void refuse_unreadable_tasks(const config::Recipe& recipe);
// Throws Error{kEnvironment} when `local_workers` ranks' model state (the ZeRO formulas) exceeds
// this node's available memory, or one rank's exceeds a GPU's.
void refuse_if_memory_short(const config::Recipe& recipe, int local_workers);

}  // namespace dstrain::launch
