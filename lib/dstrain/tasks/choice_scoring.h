#pragma once
// The log-likelihoods of multiple-choice requests (data/choice_task.h), as lm-evaluation-harness's
// HFLM._loglikelihood_tokens computes them: the input is (context + continuation)'s last
// max_length + 1 tokens less the last, the logits' log_softmax in the model's dtype, and the sum of
// the continuation's tokens' log-probs at the positions that predict them.
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "dstrain/data/choice_task.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::config {
struct Recipe;
}
namespace dstrain::model {
class CausalLM;
}
namespace dstrain::tasks {

struct EvalTarget;

// Every request's (float64), in order. Request i is computed by rank i % world (one forward each;
// every rank runs as many, so that expert parallelism's collectives pair up) and the values are
// summed over `comm` in rank order: each from one rank, so the same at any world size.
std::vector<double> request_loglikelihoods(const model::CausalLM& model, const std::vector<const data::ChoiceRequest*>& requests,
                                           int64_t max_length, const c10::Device& device, comm::Communicator& comm);

// The launcher's part of `dstrain eval --task`: each task file read and tokenized with the model's
// tokenizer (`tokenizer_dir`, else the Hugging Face target's, model.init_from's or the run's data's),
// named by its file stem, as JSON for the workers. Errors name the file and line, or the flag.
std::string encode_choice_tasks(const std::vector<std::string>& paths, const std::string& tokenizer_dir, const EvalTarget& target,
                                const config::Recipe& recipe, data::TaskFormat format = data::TaskFormat::kDstrain);

// The workers' part: every task's acc and acc_norm over all ranks, as the result JSON text
// {"step", "world_size", "tasks": [{"name", "acc", "acc_norm", "n", "requests"}]}, and each
// question as a JSON line {"task", "index", "gold", "loglikelihoods", "pred", "pred_norm"}
// (--log-samples, as lm-eval's), on every rank.
struct ChoiceResults {
  std::string json, samples;
};
ChoiceResults score_choice_tasks(const std::vector<data::ChoiceTask>& tasks, const model::CausalLM& model, int64_t max_length,
                                 const c10::Device& device, comm::Communicator& comm, int64_t step);

// That result as a table, a row per task.
std::string choice_tasks_table(const std::string& result_json);

}  // namespace dstrain::tasks
