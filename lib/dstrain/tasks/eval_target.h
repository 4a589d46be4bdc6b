#pragma once
// What `dstrain eval TARGET` scores, and with which settings: TARGET is a run directory (its
// latest checkpoint that verifies, `--step N`, or `--step best`), one checkpoint of a run, or a
// Hugging Face model folder; the flags override the run's eval and data settings. The recipe it
// produces is what the workers build the model and the evaluation sets from: checked here, in the
// launcher, so that a bad target, flag or dataset is one clear error before any worker starts.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::tasks {

struct EvalTarget {
  std::string run_dir;           // the run whose config builds the model ("" for a Hugging Face folder)
  std::string checkpoint;        // the checkpoint whose weights are read ("" for a Hugging Face folder)
  std::string hf_dir;            // a Hugging Face model folder ("" otherwise)
  std::optional<int64_t> step;   // the checkpoint's step
  int64_t written_by = 0;        // ranks of the run that wrote the checkpoint
  std::string describe() const;  // for the report's first line
};

// step: "" (the latest committed checkpoint that verifies), a step number, or "best".
// Throws Error{kUsage} for a target that is none of the three or a --step it cannot take,
// Error{kCheckpoint} for a run without the checkpoint asked for.
EvalTarget resolve_eval_target(const std::string& target, const std::string& step);

struct EvalFlags {
  std::vector<std::string> data, names;  // empty data: the run's own evaluation sets
  std::optional<int64_t> max_batches, micro_batch_size, seq_len;
  std::string format;  // "": the run's data.format (a Hugging Face target: bytes for a file, megatron for PREFIX.idx/.bin)
  std::string dtype;   // "": the run's precision.dtype (fp32 for a Hugging Face target)
  int64_t expert_parallel_size = 1;
  int world_size = 1;
  std::vector<std::string> tasks;  // --task files: then only these are scored (no sets, no windows)
  bool model_only = false;         // the model alone (dstrain generate): no sets, no windows
};

// The recipe to evaluate with: the run's resolved config (or one made from the Hugging Face
// folder's config.json) with the flags applied, its sets opened once to check them and the
// weights checked against the model (names and shapes). Errors name the flag, file or tensor.
config::Recipe eval_recipe(const EvalTarget& target, const EvalFlags& flags);

// The folder of the model's tokenizer: `given` (a flag), else the Hugging Face target's,
// model.init_from's or the run's data's. Throws Error{kUsage} saying that `needs` (a command or
// flag) needs one and `flag` gives it.
std::string target_tokenizer_dir(const std::string& given, const EvalTarget& target, const config::Recipe& recipe, const std::string& needs,
                                 const std::string& flag = "--tokenizer");

}  // namespace dstrain::tasks
