#pragma once
// Generative exact-match tasks (`dstrain eval --task FILE`, eval.tasks), scored as
// lm-evaluation-harness 0.4 scores generate_until tasks with the exact_match metric:
//   - the context is encoded as HFLM encodes it (the tokenizer's special tokens, none when the
//     text starts with the BOS's text; bytes for a byte-level model);
//   - greedy generation stops at the end of sequence, at any `until` string, or after
//     max_gen_toks tokens; the text (special tokens skipped) is cut before each `until` string;
//   - each filter takes the answer out of the text: a regex's match number group_select (negative
//     from the end; a match's groups: the first that is not empty), stripped, or `fallback` when
//     nothing matches (lm-eval's RegexFilter + take_first); no regex: the text itself;
//   - exact_match: the answer equals the target after regexes_to_ignore are removed from both (in
//     order), then lower case (ignore_case), then without ASCII punctuation (ignore_punctuation).
// Files:
//   dstrain  {"context": str, "target": str} rows, after an optional first line
//            {"settings": {"until": [str], "max_gen_toks": int, "regex_pattern": str,
//            "group_select": int, "fallback": str, "ignore_case": bool, "ignore_punctuation": bool,
//            "regexes_to_ignore": [str], "strip": bool}} (lm-eval's names; defaults: no until,
//            256 tokens, no regex, case and punctuation kept, strip true: the answer and the target
//            compared without their surrounding whitespace)
//   gsm8k    {"question", "answer"} rows as downloaded (openai/gsm8k), as lm-eval's gsm8k task
//            (zero-shot): "Question: Q\nAnswer:", until "Question:", "</s>", "<|im_end|>", 256
//            tokens; exact_match is its strict-match filter ("#### (\-?[0-9\.\,]+)"),
//            exact_match_flexible its flexible-extract (the last number), ignore_case and
//            regexes_to_ignore ",", "\$", "(?s).*#### ", "\.$"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"

namespace dstrain::text {
class Regex;
}

namespace dstrain::data {

class PromptCodec;

struct AnswerFilter {
  std::string metric;         // "exact_match", "exact_match_flexible"
  std::string regex_pattern;  // "": the whole text
  int64_t group_select = 0;
  std::string fallback = "[invalid]";
};

struct ExactMatchRules {
  std::vector<std::string> regexes_to_ignore;
  bool ignore_case = false, ignore_punctuation = false;
  bool strip = false;  // dstrain's: surrounding whitespace left out of both
};

struct GenerativeQuestion {
  std::vector<int64_t> prompt;
  std::string context, target;
};

struct GenerativeTask {
  std::string name, path;
  std::vector<std::string> until;
  int64_t max_gen_toks = 256;
  std::vector<AnswerFilter> filters;  // one per metric, exact_match first
  ExactMatchRules rules;
  std::vector<GenerativeQuestion> questions;
};

// Whether `path` holds generative rows: the gsm8k format, or a dstrain file whose first row has
// "settings" or "target" (a choice task's has "choices").
bool is_generative_task_file(const std::string& path, config::TaskFormat format);

// Reads and encodes `path` with `codec`. Throws Error{kData} naming FILE:LINE for a row that is
// not an object with a string context and target (or the format's fields), for bad settings (a
// regex that does not compile), or for a context that leaves no room for max_gen_toks tokens in
// the model's `max_length` positions.
GenerativeTask read_generative_task(const std::string& path, const std::string& name, const PromptCodec& codec, int64_t max_length,
                                    config::TaskFormat format = config::TaskFormat::kDstrain);

// The tasks as JSON (the launcher hands them to the workers) and back.
std::string generative_tasks_json(const std::vector<GenerativeTask>& tasks);
std::vector<GenerativeTask> generative_tasks_from_json(const std::string& json);

// A task's answer filters and exact-match rules, their regexes compiled once.
class AnswerScorer {
 public:
  AnswerScorer(std::vector<AnswerFilter> filters, ExactMatchRules rules);
  ~AnswerScorer();
  AnswerScorer(const AnswerScorer&) = delete;
  AnswerScorer& operator=(const AnswerScorer&) = delete;

  // Filter `f`'s answer in `text` (a generation, cut at its stop strings).
  std::string answer(size_t f, const std::string& text) const;
  // Whether `answer` equals `target` under the rules.
  bool matches(const std::string& answer, const std::string& target) const;

 private:
  std::vector<AnswerFilter> filters_;
  ExactMatchRules rules_;
  std::vector<std::unique_ptr<text::Regex>> filter_regexes_;  // null: the whole text
  std::vector<std::unique_ptr<text::Regex>> ignored_;
};

}  // namespace dstrain::data
