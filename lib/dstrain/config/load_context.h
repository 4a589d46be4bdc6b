#pragma once
// State shared by the layers that build a Recipe (recipe YAML, ds_config, --set): the recipe
// being filled, where each value came from, and every problem and warning found on the way.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/config/node.h"
#include "dstrain/config/recipe.h"

namespace dstrain::config {

// A ds_config value of "auto", resolved once all layers are read.
struct PendingAuto {
  std::string ds_key;  // "optimizer.params.lr"
  Location where;
  std::string target;  // recipe key path it stands for
};

// What a ds_config leaves to be settled once every layer (--set included) is read.
struct DsPending {
  std::vector<PendingAuto> derived_autos;  // "auto" the HF integration derives from the model
  double warmup_min_lr = -1;               // WarmupLR/WarmupDecayLR absolute minimum LR
  Location warmup_min_lr_where;
  bool overlap_comm_given = false;
  Location fp16_auto, bf16_auto;  // "enabled": "auto"
  std::string scheduler;          // the ds_config's scheduler.type ("WarmupLR"), empty without one
  Location scheduler_where;
  std::string replaced_schedule;  // the recipe's own schedule.type it replaced, "NAME (SOURCE)"; empty: none
};

// Reads a file the config names (recipe, ds_config, hf_config); nullopt when it does not exist.
// The real one reads the disk; the fuzz target serves documents from memory.
using FileReader = std::function<std::optional<std::string>(const std::string& path)>;

struct LoadContext {
  FileReader read;
  std::function<int64_t(const Recipe&)> packed_rows;         // LoadOptions::packed_rows (train.epochs)
  std::function<FrozenCounts(const Recipe&)> frozen_counts;  // LoadOptions::frozen_counts (train.freeze)
  Recipe recipe;
  DsPending ds;
  std::vector<std::string> problems;
  std::vector<std::string> data_problems;  // the datasets are missing: Error{kData} when nothing else is wrong
  std::vector<std::string> warnings;
  std::vector<PendingAuto> autos;

  void problem(const Location& where, const std::string& message) { problems.push_back(where.str() + ": " + message); }
  void warning(const Location& where, const std::string& message) { warnings.push_back(where.str() + ": " + message); }
  // Assigns through the schema and records the source; reports a failure as a problem.
  // `origin` names the key as the user wrote it (e.g. the ds_config key) when it differs.
  bool set(const std::string& path, const Node& value, const Location& where, bool lax, const std::string& origin = "");
  bool explicitly_set(const std::string& path) const;
};

// " (a recipe's paths are relative to its own directory, DIR; ... write REL)" when `key` came from
// the recipe file and `path` (resolved) does not exist; "" otherwise. Says the path that the same
// text names from the current directory, when that one exists.
std::string recipe_relative_note(const Recipe& r, const std::string& key, const std::string& path);

// load_recipe with documents from `read` instead of the disk (fuzzing, tests).
Recipe load_recipe_with(const std::string& path, const std::vector<std::string>& overrides, FileReader read, const LastLayer& last = {},
                        const LoadOptions& options = {});

// Reads a ds_config document into ctx (DeepSpeed's semantics; see deepspeed-semantics.md).
void apply_ds_config(const Node& root, LoadContext& ctx);
// Settles what the ds_config left pending (derived "auto", DeepSpeed's conditional defaults);
// runs after the --set layer, before resolve_and_validate.
void finish_ds_config(LoadContext& ctx);
// Fills model sizes from a Hugging Face config.json.
void apply_hf_config(const std::string& path, const Location& where, LoadContext& ctx);
// Batch triple, length in steps, "auto" values and DeepSpeed's conditional defaults, then
// cross-field validation. Called once every layer has been read.
// "auto" filled from the recipe (or with HF TrainingArguments' defaults for the optimizer and
// clipping); each one left open is a problem. After finish_ds_config, before the problem check.
void resolve_autos(LoadContext& ctx);
// With model.init_from: HF TrainingArguments' lr, weight decay and beta2 for what no layer set.
void apply_fine_tuning_defaults(LoadContext& ctx);
// config.json names MTP modules that model.init_from's weights lack: trains without them, said.
void leave_out_missing_mtp(LoadContext& ctx);
void resolve_and_validate(LoadContext& ctx);

}  // namespace dstrain::config
