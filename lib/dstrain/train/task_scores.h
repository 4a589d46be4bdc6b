#pragma once
// eval.tasks and `dstrain eval --task`: task files of both kinds (data/task_set.h) read for a run,
// and scored (train/choice_scores.h, train/generative_scores.h).
#include <c10/core/Device.h>

#include <cstdint>

#include "dstrain/data/task_set.h"
#include "dstrain/train/task_results.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
class CausalLM;
}
namespace dstrain::train {

// Both kinds: the multiple-choice tasks first, then the generative (train/generative_scores.h).
TaskResults score_tasks(const data::TaskSet& tasks, const model::CausalLM& model, int64_t max_length, const c10::Device& device,
                        comm::Communicator& comm, int64_t step);

// eval.tasks read and tokenized with the run's tokenizer (or bytes), each named by its file stem.
// Throws Error{kConfig} for a multiple-choice task without a tokenizer, Error{kData} naming a task
// file's line.
data::TaskSet read_eval_tasks(const config::Recipe& recipe);

}  // namespace dstrain::train
