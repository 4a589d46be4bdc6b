#include "dstrain/tasks/run_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/run/run_dir.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;
namespace {

std::vector<int64_t> committed_steps(const std::string& root) {
  std::vector<int64_t> steps;
  for (const auto& dir : ckpt::checkpoint_candidates(root)) steps.push_back(ckpt::Reader(dir, /*verified=*/true).state().step);
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

std::string run_checkpoint(const std::string& run, const std::string& root, const std::string& step, const std::string& flag) {
  if (step.empty()) {
    std::vector<std::string> skipped;
    const auto usable = ckpt::usable_checkpoint(root, &skipped);
    for (const auto& why : skipped) log::warn("skipping a checkpoint that does not verify: " + why);
    if (!usable)
      throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint that verifies (none in {})", run, root),
                  "train it until its first checkpoint; its logs are in " + run::RunDir(run).log_dir());
    return *usable;
  }
  const std::string have = fmt::format("{}", fmt::join(committed_steps(root), ", "));
  const std::string hint = have.empty() ? "it has no committed checkpoint yet" : "its committed checkpoints are of steps " + have;
  if (step == "best") {
    const auto best = ckpt::best_checkpoint(root);
    if (!best)
      throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no best checkpoint ({}/best)", run, root),
                  fmt::format("only checkpoint.keep_best with an eval block keeps one; pass {} N ({})", flag, hint));
    return *best;
  }
  int64_t n = -1;
  try {
    size_t used = 0;
    n = std::stoll(step, &used);
    if (used != step.size()) n = -1;
  } catch (const std::exception&) {}
  if (n < 0) throw Error(ErrorCode::kUsage, fmt::format("{} '{}' is not a step number or 'best'", flag, step), hint);
  const std::string dir = (fs::path(root) / ckpt::step_dir_name(n)).string();
  if (!fs::is_regular_file(fs::path(dir) / "COMMITTED"))
    throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint of step {} ({})", run, n, dir), hint);
  return dir;
}

}  // namespace dstrain::tasks
