#pragma once
// Multiple-choice tasks scored as lm-evaluation-harness's HFLM scores them (data/choice_task.h
// encodes them): each request's log-likelihood from one forward, the input (context +
// continuation)'s last max_length + 1 tokens less the last, the sum of the continuation's tokens'
// log-probs; then acc and acc_norm per task. `dstrain eval --task` and eval.tasks during training.
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/data/choice_task.h"
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

// Every request's (float64), in order. Request i is computed by rank i % world (one forward each;
// every rank runs as many, so that ZeRO-3's gathers and expert parallelism's collectives pair up)
// and the values are summed over `comm` in rank order: each from one rank, so the same at any
// world size.
std::vector<double> request_loglikelihoods(const model::CausalLM& model, const std::vector<const data::ChoiceRequest*>& requests,
                                           int64_t max_length, const c10::Device& device, comm::Communicator& comm);

// Every multiple-choice task's acc and acc_norm over all ranks (task_results.h).
TaskResults score_choice_tasks(const std::vector<data::ChoiceTask>& tasks, const model::CausalLM& model, int64_t max_length,
                               const c10::Device& device, comm::Communicator& comm, int64_t step);

// A run's tokenizer folder: model.init_from's (when it has tokenizer.json), else the one its
// prepared data was tokenized with; "" when neither (a byte-level run).
std::string run_tokenizer_dir(const config::Recipe& recipe);
// A run trained on bytes (prepare-data without a tokenizer, or data.format bytes): its
// end-of-document id (-1: none); nullopt when it has a tokenizer, or neither is known.
std::optional<int64_t> byte_level_end(const config::Recipe& recipe);

}  // namespace dstrain::train
