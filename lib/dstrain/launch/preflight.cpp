#include "dstrain/launch/preflight.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "dstrain/train/choice_scores.h"
#include "dstrain/train/task_scores.h"
#include "dstrain/train/samples.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/hf_overrides.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/device/training_device.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain_cuda.h"

namespace dstrain::launch {
namespace {

// Model state alone (parameters, gradients, master weights, Adam states: the ZeRO formulas) must
// fit in this node's memory: without a GPU all of it lives in host RAM. A run that cannot fit is
// refused before any worker starts, instead of dying in the kernel's OOM killer minutes later.
void refuse_if_host_memory_short(const config::Recipe& recipe, int local_workers) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double available_kib = -1, value = 0;
  std::string unit;
  while (meminfo >> key >> value >> unit)
    if (key == "MemAvailable:") available_kib = value;
  if (available_kib <= 0) return;
  const cost::ModelStateMemory per_rank = cost::model_state_memory(recipe);
  const bool on_gpu = at::hasCUDA();
  const double needed = local_workers * (per_rank.host_bytes + (on_gpu ? 0.0 : per_rank.device_bytes));
  const double available = available_kib * 1024.0;
  if (needed > available)
    throw Error(
        ErrorCode::kEnvironment,
        fmt::format("the model state needs {:.1f} GiB of host memory on this node ({} workers x {:.1f} GiB: parameters, gradients and "
                    "optimizer states at ZeRO stage {}, {}), but only {:.1f} GiB is available",
                    needed / 1073741824.0, local_workers, needed / local_workers / 1073741824.0, recipe.zero.stage,
                    config::name(recipe.precision.dtype), available / 1073741824.0),
        "spread the run over more nodes, raise zero.stage, or train a smaller model; `dstrain train --dry-run` shows the estimate");
}

// On GPUs, the model state per rank (the ZeRO formulas) must fit in each GPU this node's ranks
// use: refused before any worker starts, with what to change, instead of a CUDA OOM later.
void refuse_if_gpu_memory_short(const config::Recipe& recipe, int local_workers) {
  const int gpus = dstrain_cuda_device_count();
  const double needed = cost::model_state_memory(recipe).device_bytes;
  for (int g = 0; g < std::min(gpus, local_workers); ++g) {
    int major = 0, minor = 0;
    size_t total = 0;
    if (dstrain_cuda_device_props(g, &major, &minor, &total) != 0 || total == 0) continue;
    if (needed > static_cast<double>(total))
      throw Error(
          ErrorCode::kEnvironment,
          fmt::format("the model state alone needs {:.1f} GiB per rank (parameters, gradients and optimizer states at ZeRO stage {}, {}), "
                      "more than GPU {}'s {:.1f} GiB, before any activations",
                      needed / 1073741824.0, recipe.zero.stage, config::name(recipe.precision.dtype), g,
                      static_cast<double>(total) / 1073741824.0),
          device::out_of_memory_hint(recipe));
  }
}

}  // namespace

void refuse_mismatched_init_weights(const config::Recipe& recipe) {
  if (recipe.model.init_from.empty()) return;
  model::check_hf_weights(recipe.model.init_from, model::model_tensor_shapes(recipe.model), config::init_weights_hint(recipe));
}

void refuse_quantized_base_without_weights(const config::Recipe& recipe) {
  if (!recipe.lora.enabled() || recipe.lora.base == config::LoraBase::kModel || !recipe.model.init_from.empty()) return;
  throw Error(ErrorCode::kConfig,
              fmt::format("lora.base {} ({}): there is no base to quantize: model.init_from is not set", config::name(recipe.lora.base),
                          recipe.sources.count("lora.base") ? recipe.sources.at("lora.base") : "the recipe"),
              "set model.init_from to the Hugging Face folder the adapters train on, or lora.base: model to train on a freshly "
              "initialised base (`--dry-run` plans the recipe without the weights)");
}

void refuse_unreadable_tasks(const config::Recipe& recipe) {
  train::read_eval_tasks(recipe);
  if (!recipe.eval.samples.empty()) train::SampleWriter check(recipe);
}

void refuse_if_memory_short(const config::Recipe& recipe, int local_workers) {
  refuse_if_host_memory_short(recipe, local_workers);
  refuse_if_gpu_memory_short(recipe, local_workers);
}

}  // namespace dstrain::launch
