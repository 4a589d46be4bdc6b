#include "dstrain/train/export.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/train/run_dir.h"

namespace dstrain::train {

std::string export_run_to_hf(const std::string& run_path, const std::string& checkpoint_dir, const std::string& out_dir) {
  const RunDir run_dir(run_path);
  const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
  std::string dir = checkpoint_dir;
  if (dir.empty()) {
    const auto latest = ckpt::latest_checkpoint(run_dir.ckpt_dir(recipe));
    if (!latest) throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint", run_path), "train it first");
    dir = *latest;
  }
  const ckpt::Checkpoint ck = ckpt::load_checkpoint(dir);
  std::map<std::string, const ckpt::TensorData*> by_name;
  for (const auto& t : ck.tensors) by_name[t.name] = &t;
  const auto model = model::make_model(recipe.model, recipe.seed);
  c10::NoGradGuard no_grad;
  for (const auto* group : {&model->parameters(), &model->buffers()})
    for (const auto& p : *group) {
      const auto it = by_name.find(p.name);
      if (it == by_name.end() || it->second->bytes.size() != static_cast<size_t>(p.tensor.nbytes()))
        throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {} lacks '{}' or holds it with another shape", dir, p.name),
                    "export with the run directory that wrote the checkpoint");
      std::memcpy(p.tensor.data_ptr(), it->second->bytes.data(), it->second->bytes.size());
    }
  model::export_hf(recipe.model, model->parameters(), model->buffers(), out_dir);
  return dir;
}

}  // namespace dstrain::train
