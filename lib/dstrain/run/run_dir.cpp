#include "dstrain/run/run_dir.h"

#include <fmt/format.h>

#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/error.h"

namespace dstrain::run {
namespace fs = std::filesystem;

void RunDir::prepare_new(const config::Recipe& recipe) const {
  if (fs::exists(config_path()) || fs::exists(ckpt_dir()) || fs::exists(ckpt_dir(recipe) + "/latest"))
    throw Error(ErrorCode::kUsage, fmt::format("run_dir '{}' (checkpoints in {}) already holds a run", root_, ckpt_dir(recipe)),
                fmt::format("continue it with `dstrain resume {}`, or start a new one elsewhere, e.g. --set run_dir={}-2", root_, root_));
  fs::create_directories(log_dir());
  config::write_resolved_config(recipe, config_path());
}

void RunDir::check_resumable(const config::Recipe& recipe) const {
  if (!ckpt::has_committed_checkpoint(ckpt_dir(recipe)))
    throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint to resume from", recipe.run_dir),
                "start it with `dstrain train` instead");
}

}  // namespace dstrain::run
