#pragma once
// The task files of `dstrain eval --task` and eval.tasks: multiple-choice (data/choice_task.h) and
// generative exact-match (data/generative_task.h) tasks, each file one task named by its stem, with
// what the workers need to decode generations: the tokenizer folder (or a byte-level model's end
// of document) and the ids that end a sequence.
#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/data/choice_task.h"
#include "dstrain/data/generative_task.h"

namespace dstrain::data {

struct TaskSet {
  std::vector<ChoiceTask> choice;
  std::vector<GenerativeTask> generative;
  std::string tokenizer_dir;     // "": bytes
  int64_t end_of_document = -1;  // a byte-level model's
  std::vector<int64_t> stop_ids;
  int64_t batch_size = 1;  // generative questions per generate() (eval.task_batch_size, --task-batch-size)
  bool empty() const { return choice.empty() && generative.empty(); }
};

// Reads every file in `format` (dstrain files: a file's first row decides its kind). Throws
// Error{kData} naming FILE:LINE, Error{kConfig} (`no_tokenizer_hint`) for a multiple-choice file
// without a tokenizer (`tokenizer_dir` ""). `stop_ids`: beyond the tokenizer's end of sequence.
TaskSet read_task_set(const std::vector<std::string>& paths, const std::string& tokenizer_dir, int64_t end_of_document, int64_t max_length,
                      config::TaskFormat format, const std::vector<int64_t>& stop_ids, const std::string& no_tokenizer_hint);

std::string task_set_json(const TaskSet& set);
TaskSet task_set_from_json(const std::string& json);

}  // namespace dstrain::data
