#pragma once
// Multiple-choice tasks (`dstrain eval --task FILE`): JSON Lines rows
//   {"context": str, "choices": [str, ...], "gold": int}
// scored as lm-evaluation-harness 0.4's multiple_choice output type scores a task with its
// default target_delimiter " ": choice c of a row is the request (context, " " + c), tokenized as
// HFLM tokenizes loglikelihood requests (api/model.py _encode_pair, models/huggingface.py
// tok_encode):
//   - the context's trailing whitespace moves to the front of the continuation;
//   - context + continuation and the context are encoded with the tokenizer's special tokens (its
//     post-processor's BOS), or without them when the text starts with the prefix token's text;
//     the continuation is the whole's ids past the context's;
//   - an empty context is the prefix token alone (the tokenizer's bos_token, else its eos_token).
// acc: the choice of the largest log-likelihood is gold (the first on ties, as numpy's argmax);
// acc_norm: the same on each log-likelihood divided by its choice's length in characters.
// The rows of three datasets as users download them (JSON Lines) are read as lm-eval's task
// definitions turn them into these (tasks/hellaswag, tasks/arc, tasks/mmlu/default):
//   hellaswag  {activity_label, ctx_a, ctx_b, endings, label}: context preprocess(activity_label +
//              ": " + ctx_a + " " + ctx_b.capitalize()), choices preprocess(ending) (its utils.py:
//              strip, " [title]" -> ". ", [...] removed, double spaces halved; capitalize on ASCII)
//   arc        {question, choices: {text, label}, answerKey}: "Question: Q\nAnswer:", the texts,
//              gold the label's index
//   mmlu       {question, choices (4), answer}: "Q.strip()\nA. c0\nB. c1\nC. c2\nD. c3\nAnswer:",
//              choices A B C D, gold answer
#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"

namespace dstrain::text {
class Tokenizer;
}
namespace dstrain::data {

struct ChoiceRequest {
  std::vector<uint32_t> context, continuation;
};

struct ChoiceQuestion {
  int64_t gold = 0;
  std::vector<double> choice_chars;     // each choice's length in characters (acc_norm)
  std::vector<ChoiceRequest> requests;  // one per choice
};

struct ChoiceTask {
  std::string name, path;
  std::vector<ChoiceQuestion> questions;
  int64_t requests() const;
};

// Reads and tokenizes `path` (`tokenizer_dir`: the tokenizer folder, for its tokenizer_config.json's
// bos_token and eos_token). Throws Error{kData} naming FILE:LINE for a row that is not an object with
// a string context, a non-empty list of strings as choices and an integer gold in range, or whose
// request (context + continuation) has more than `max_length` + 1 tokens with a continuation that
// alone does not fit: what the model's context cannot score.
using TaskFormat = config::TaskFormat;
// "dstrain", "hellaswag", "arc", "mmlu" or "gsm8k" (data/generative_task.h); Error{kUsage} otherwise.
TaskFormat task_format(const std::string& name);

ChoiceTask read_choice_task(const std::string& path, const std::string& name, const text::Tokenizer& tokenizer,
                            const std::string& tokenizer_dir, int64_t max_length, TaskFormat format = TaskFormat::kDstrain);

// The tasks as JSON (the launcher hands them to the workers) and back.
std::string choice_tasks_json(const std::vector<ChoiceTask>& tasks);
std::vector<ChoiceTask> choice_tasks_from_json(const std::string& json);

struct ChoiceScore {
  double acc = 0, acc_norm = 0;
  int64_t n = 0;
  std::vector<int64_t> pred, pred_norm;  // each question's chosen choice, plain and per character
};
// `loglikelihoods`: every request's, in the task's order (question by question, choice by choice).
ChoiceScore score_choice_task(const ChoiceTask& task, const std::vector<double>& loglikelihoods);

}  // namespace dstrain::data
