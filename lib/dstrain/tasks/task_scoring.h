#pragma once
// The launcher's part of `dstrain eval --task` (the workers score with train/choice_scores.h and
// train/generative_scores.h): the task files read and encoded, and the results as a table.
#include <string>
#include <vector>

#include "dstrain/data/task_set.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::tasks {

struct EvalTarget;

// Each task file read and encoded with the model's tokenizer (`tokenizer_dir`, else the Hugging
// Face target's, model.init_from's or the run's data's; a byte-level run's bytes), named by its
// file stem, as JSON for the workers (data::task_set_json), generation_config.json's end-of-
// sequence ids included. Errors name the file and line, or the flag.
// `batch_size`: generative questions per generate() (--task-batch-size).
std::string encode_tasks(const std::vector<std::string>& paths, const std::string& tokenizer_dir, const EvalTarget& target,
                         const config::Recipe& recipe, data::TaskFormat format = data::TaskFormat::kDstrain, int64_t batch_size = 1);

// The result JSON (train::score_tasks') as a table, a row per task.
std::string tasks_table(const std::string& result_json);

}  // namespace dstrain::tasks
