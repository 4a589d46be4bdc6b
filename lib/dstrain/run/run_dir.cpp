#include "dstrain/run/run_dir.h"

#include <fmt/format.h>

#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"

namespace dstrain::run {
namespace fs = std::filesystem;

namespace {

// What a run writes into its directory besides ckpt/ and its locks: what a new run moves aside.
constexpr const char* kAttemptFiles[] = {"config.resolved.json", ".run_id",        "logs",        "metrics.jsonl",
                                         "stragglers.jsonl",     "failures.jsonl", "memory.json", "csv",
                                         "tensorboard",          "profile",        "report",      "SAVE_NOW"};

// The checkpoint directories a run directory's old and new runs use.
std::vector<std::string> checkpoint_dirs(const RunDir& dir, const config::Recipe& recipe) {
  std::vector<std::string> dirs{dir.ckpt_dir(), dir.ckpt_dir(recipe)};
  try {
    if (fs::exists(dir.config_path())) dirs.push_back(dir.ckpt_dir(config::read_resolved_config(dir.config_path())));
  } catch (const Error&) {  // an unreadable old config: its own checkpoint dir is unknown, ckpt/ is still checked
  }
  return dirs;
}

// A word a shell reads back as it is: quoted unless it is plain.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() &&
                     word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,:/@") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string train_command(const config::Recipe& recipe) {
  // The keys the original command line set, so that the same run starts again.
  std::string sets;
  config::Recipe copy = recipe;
  for (const auto& [key, source] : recipe.sources)
    if (source == "--set" && key != "run_dir")
      if (const config::Field* f = config::find_field(key)) sets += " --set " + shell_word(key + "=" + config::value_text(*f, copy));
  // dstrain's own launcher: the topology it ran with, which flags may have set (they are not
  // --set values). Under torchrun, Slurm or MPI the environment gives it again.
  std::string flags;
  const auto topology = recipe.sources.find("launch.nproc_per_node");
  if (topology != recipe.sources.end() && (topology->second == "topology: recipe" || topology->second == "topology: flags")) {
    flags += fmt::format(" --nproc-per-node {}", recipe.launch.nproc_per_node);
    if (recipe.launch.nnodes != 1)
      flags += fmt::format(" --nnodes {} --node-rank N --master-addr {}", recipe.launch.nnodes, recipe.launch.master_addr);
  }
  return fmt::format("dstrain train {}{} --set {}{}", recipe.source_path.empty() ? "RECIPE" : shell_word(recipe.source_path), flags,
                     shell_word("run_dir=" + recipe.run_dir), sets);
}

}  // namespace

void RunDir::prepare_new(const config::Recipe& recipe) const {
  set_aside_unsaved_run(recipe);
  fs::create_directories(log_dir());
  config::write_resolved_config(recipe, config_path());
}

void RunDir::set_aside_unsaved_run(const config::Recipe& recipe) const {
  const bool holds_run = fs::exists(config_path()) || fs::exists(ckpt_dir()) || fs::exists(ckpt_dir(recipe) + "/latest");
  if (holds_run) {
    for (const auto& dir : checkpoint_dirs(*this, recipe))
      if (ckpt::has_committed_checkpoint(dir))
        throw Error(
            ErrorCode::kUsage, fmt::format("run_dir '{}' (checkpoints in {}) already holds a run", root_, dir),
            fmt::format("continue it with `dstrain resume {}`, or start a new one elsewhere, e.g. --set run_dir={}-2", root_, root_));
    int n = 1;
    while (fs::exists(previous_attempt_dir(n))) ++n;
    const std::string kept = previous_attempt_dir(n);
    fs::create_directories(kept);
    for (const char* name : kAttemptFiles)
      if (fs::exists(fs::symlink_status(root_ + "/" + name))) fs::rename(root_ + "/" + name, kept + "/" + name);
    log::warn(
        fmt::format("run_dir '{}' held a run that stopped before its first checkpoint: starting anew in its place (that "
                    "attempt's config, logs and metrics are in {})",
                    root_, kept));
  }
}

void RunDir::check_resumable(const config::Recipe& recipe) const {
  if (!ckpt::has_committed_checkpoint(ckpt_dir(recipe)))
    throw Error(ErrorCode::kCheckpoint,
                fmt::format("run '{}' has no committed checkpoint to resume from: it stopped before its first save", recipe.run_dir),
                fmt::format("start it again with `{}` (the new run takes over the directory and keeps this attempt's logs)",
                            train_command(recipe)));
}

}  // namespace dstrain::run
