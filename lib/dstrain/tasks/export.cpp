#include "dstrain/tasks/export.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/run/run_dir.h"

namespace dstrain::tasks {

std::string export_run_to_hf(const std::string& run_path, const std::string& checkpoint_dir, const std::string& out_dir) {
  const run::RunDir run_dir(run_path);
  const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
  std::string dir = checkpoint_dir;
  if (dir.empty()) {
    std::vector<std::string> skipped;
    const auto usable = ckpt::usable_checkpoint(run_dir.ckpt_dir(recipe), &skipped);
    for (const auto& why : skipped) log::warn("skipping a checkpoint that does not verify: " + why);
    if (!usable)
      throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint that verifies", run_path), "train it first");
    dir = *usable;
  }
  // Only the parameters (the fp32 master weights) and buffers are read, whatever the shards.
  const ckpt::Reader reader(dir);
  const auto model = model::make_model(recipe.model, recipe.seed);
  c10::NoGradGuard no_grad;
  for (const auto* group : {&model->parameters(), &model->buffers()})
    for (const auto& p : *group) {
      const ckpt::TensorMeta* meta = reader.find(p.name);
      if (!meta || meta->shape != p.tensor.sizes().vec())
        throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {} lacks '{}' or holds it with another shape", dir, p.name),
                    "export with the run directory that wrote the checkpoint");
      reader.read(p.name, 0, p.tensor.numel(), p.tensor.data_ptr(), "float32");
    }
  model::export_hf(recipe.model, model->parameters(), model->buffers(), out_dir);
  return dir;
}

}  // namespace dstrain::tasks
