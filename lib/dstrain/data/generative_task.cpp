#include "dstrain/data/generative_task.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dstrain/core/error.h"
#include "dstrain/data/json_lines.h"
#include "dstrain/data/prompts.h"
#include "dstrain/text/python_str.h"
#include "dstrain/text/regex.h"

namespace dstrain::data {
namespace {

using Json = nlohmann::json;

const char* const kRowHint =
    "each row is {\"context\": \"...\", \"target\": \"...\"}, after an optional first line {\"settings\": {...}} (README: Generative "
    "tasks)";

std::unique_ptr<text::Regex> compile(const std::string& pattern) {
  return std::make_unique<text::Regex>(pattern, text::RegexSyntax::kPython,
                                       "fix the pattern (Python's re syntax) in the task file's settings");
}

// lm-eval's gsm8k task (tasks/gsm8k/gsm8k.yaml), zero-shot.
void gsm8k_settings(GenerativeTask& t) {
  t.until = {"Question:", "</s>", "<|im_end|>"};
  t.max_gen_toks = 256;
  t.filters = {{"exact_match", "#### (\\-?[0-9\\.\\,]+)", 0, "[invalid]"},
               {"exact_match_flexible", "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]"}};
  t.rules = {{",", "\\$", "(?s).*#### ", "\\.$"}, true, false, false};
}

template <typename T>
T setting(const Json& s, const char* key, T fallback, bool (Json::*is)() const noexcept, const char* what) {
  if (!s.contains(key)) return fallback;
  if (!(s[key].*is)()) throw std::invalid_argument(fmt::format("settings \"{}\" is not {}", key, what));
  return s[key].get<T>();
}

std::vector<std::string> strings(const Json& s, const char* key) {
  if (!s.contains(key)) return {};
  if (!s[key].is_array()) throw std::invalid_argument(fmt::format("settings \"{}\" is not a list of strings", key));
  std::vector<std::string> out;
  for (const Json& v : s[key]) {
    if (!v.is_string()) throw std::invalid_argument(fmt::format("settings \"{}\" holds {}, not a string", key, v.dump()));
    out.push_back(v.get<std::string>());
  }
  return out;
}

void read_settings(const Json& row, GenerativeTask& t) {
  const Json& s = row["settings"];
  if (!s.is_object()) throw std::invalid_argument("\"settings\" is not an object");
  static const std::vector<std::string> known = {"until",       "max_gen_toks", "regex_pattern",      "group_select",     "fallback",
                                                 "ignore_case", "strip",        "ignore_punctuation", "regexes_to_ignore"};
  for (const auto& item : s.items())
    if (std::find(known.begin(), known.end(), item.key()) == known.end())
      throw std::invalid_argument(fmt::format("settings has an unknown key \"{}\" (known: {})", item.key(), fmt::join(known, ", ")));
  t.until = strings(s, "until");
  t.max_gen_toks = setting<int64_t>(s, "max_gen_toks", 256, &Json::is_number_integer, "an integer");
  if (t.max_gen_toks < 1) throw std::invalid_argument("settings \"max_gen_toks\" is less than 1");
  AnswerFilter f{"exact_match", setting<std::string>(s, "regex_pattern", "", &Json::is_string, "a string"),
                 setting<int64_t>(s, "group_select", 0, &Json::is_number_integer, "an integer"),
                 setting<std::string>(s, "fallback", "[invalid]", &Json::is_string, "a string")};
  t.filters = {f};
  t.rules.regexes_to_ignore = strings(s, "regexes_to_ignore");
  t.rules.ignore_case = setting<bool>(s, "ignore_case", false, &Json::is_boolean, "true or false");
  t.rules.ignore_punctuation = setting<bool>(s, "ignore_punctuation", false, &Json::is_boolean, "true or false");
  t.rules.strip = setting<bool>(s, "strip", true, &Json::is_boolean, "true or false");
  for (const std::string& pattern : t.rules.regexes_to_ignore) compile(pattern);
  if (!f.regex_pattern.empty()) compile(f.regex_pattern);
}

// A row's (context, target).
std::pair<std::string, std::string> context_and_target(const Json& row, config::TaskFormat format) {
  if (!row.is_object()) throw std::invalid_argument("a row is a JSON object");
  const char* context_key = format == config::TaskFormat::kGsm8k ? "question" : "context";
  const char* target_key = format == config::TaskFormat::kGsm8k ? "answer" : "target";
  for (const char* key : {context_key, target_key})
    if (!row.contains(key) || !row[key].is_string()) throw std::invalid_argument(fmt::format("\"{}\" is missing or not a string", key));
  std::string context = row[context_key].get<std::string>();
  if (format == config::TaskFormat::kGsm8k) context = "Question: " + context + "\nAnswer:";
  return {context, row[target_key].get<std::string>()};
}

}  // namespace

bool is_generative_task_file(const std::string& path, config::TaskFormat format) {
  if (format == config::TaskFormat::kGsm8k) return true;
  if (format != config::TaskFormat::kDstrain) return false;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      const Json row = Json::parse(line, nullptr, false);
      return row.is_object() && (row.contains("settings") || row.contains("target")) && !row.contains("choices");
    }
  return false;
}

GenerativeTask read_generative_task(const std::string& path, const std::string& name, const PromptCodec& codec, int64_t max_length,
                                    config::TaskFormat format) {
  GenerativeTask task;
  task.name = name, task.path = path;
  task.filters = {{"exact_match", "", 0, "[invalid]"}};
  task.rules.strip = true;
  if (format == config::TaskFormat::kGsm8k) gsm8k_settings(task);
  const std::string bos = codec.bos_text();
  for_each_json_line(path, kRowHint, "pass a JSON Lines file to --task", [&](const std::string& line) {
    const Json row = Json::parse(line, nullptr, false);
    if (row.is_discarded()) throw std::invalid_argument("not valid JSON");
    if (row.is_object() && row.contains("settings")) {
      if (format != config::TaskFormat::kDstrain || !task.questions.empty())
        throw std::invalid_argument("\"settings\" belongs on the first line of a dstrain task file");
      return read_settings(row, task);
    }
    auto [context, target] = context_and_target(row, format);
    if (context.empty()) throw std::invalid_argument("\"context\" is empty: there is nothing to generate from");
    // HFLM's tok_batch_encode: no special tokens for a text that already starts with the BOS's.
    const bool has_bos = !bos.empty() && context.compare(0, bos.size(), bos) == 0;
    std::vector<int64_t> prompt = codec.encode_text(context, !has_bos);
    if (prompt.empty()) throw std::invalid_argument("the context gives no token");
    const int64_t needed = static_cast<int64_t>(prompt.size()) + task.max_gen_toks;
    if (needed > max_length)
      throw std::invalid_argument(fmt::format("the context's {} tokens and max_gen_toks {} make {}, more than the model's {} positions",
                                              prompt.size(), task.max_gen_toks, needed, max_length));
    task.questions.push_back({std::move(prompt), std::move(context), std::move(target)});
  });
  if (task.questions.empty()) throw Error(ErrorCode::kData, fmt::format("{}: no task rows", path), kRowHint);
  return task;
}

std::string generative_tasks_json(const std::vector<GenerativeTask>& tasks) {
  Json out = Json::array();
  for (const GenerativeTask& t : tasks) {
    Json filters = Json::array(), questions = Json::array();
    for (const AnswerFilter& f : t.filters) filters.push_back({f.metric, f.regex_pattern, f.group_select, f.fallback});
    for (const GenerativeQuestion& q : t.questions) questions.push_back({q.prompt, q.context, q.target});
    out.push_back({{"name", t.name},
                   {"path", t.path},
                   {"until", t.until},
                   {"max_gen_toks", t.max_gen_toks},
                   {"filters", filters},
                   {"rules", {t.rules.regexes_to_ignore, t.rules.ignore_case, t.rules.ignore_punctuation, t.rules.strip}},
                   {"questions", questions}});
  }
  return out.dump();
}

std::vector<GenerativeTask> generative_tasks_from_json(const std::string& json) {
  std::vector<GenerativeTask> tasks;
  for (const Json& t : Json::parse(json)) {
    GenerativeTask task;
    task.name = t.at("name").get<std::string>(), task.path = t.at("path").get<std::string>();
    task.until = t.at("until").get<std::vector<std::string>>();
    task.max_gen_toks = t.at("max_gen_toks").get<int64_t>();
    for (const Json& f : t.at("filters"))
      task.filters.push_back({f.at(0).get<std::string>(), f.at(1).get<std::string>(), f.at(2).get<int64_t>(), f.at(3).get<std::string>()});
    const Json& r = t.at("rules");
    task.rules = {r.at(0).get<std::vector<std::string>>(), r.at(1).get<bool>(), r.at(2).get<bool>(), r.at(3).get<bool>()};
    for (const Json& q : t.at("questions"))
      task.questions.push_back({q.at(0).get<std::vector<int64_t>>(), q.at(1).get<std::string>(), q.at(2).get<std::string>()});
    tasks.push_back(std::move(task));
  }
  return tasks;
}

AnswerScorer::AnswerScorer(std::vector<AnswerFilter> filters, ExactMatchRules rules)
    : filters_(std::move(filters)), rules_(std::move(rules)) {
  for (const AnswerFilter& f : filters_) filter_regexes_.push_back(f.regex_pattern.empty() ? nullptr : compile(f.regex_pattern));
  for (const std::string& pattern : rules_.regexes_to_ignore) ignored_.push_back(compile(pattern));
}

AnswerScorer::~AnswerScorer() = default;

std::string AnswerScorer::answer(size_t f, const std::string& text) const {
  const AnswerFilter& filter = filters_.at(f);
  if (!filter_regexes_[f]) return text;
  const std::vector<std::vector<std::string>> matches = filter_regexes_[f]->find_groups(text);
  if (matches.empty()) return filter.fallback;
  const auto n = static_cast<int64_t>(matches.size());
  const int64_t at = filter.group_select < 0 ? n + filter.group_select : filter.group_select;
  if (at < 0 || at >= n) return filter.fallback;  // Python would raise IndexError; lm-eval's rows never ask
  const std::vector<std::string>& groups = matches[static_cast<size_t>(at)];
  if (groups.size() == 1) return text::python_strip(groups[0]);
  for (const std::string& g : groups)
    if (!g.empty()) return text::python_strip(g);
  return filter.fallback;
}

bool AnswerScorer::matches(const std::string& answer, const std::string& target) const {
  std::string a = answer, b = target;
  for (const auto& ignored : ignored_) a = ignored->remove_all(a), b = ignored->remove_all(b);
  if (rules_.ignore_case) a = text::python_lower(a), b = text::python_lower(b);
  if (rules_.ignore_punctuation) a = text::remove_ascii_punctuation(a), b = text::remove_ascii_punctuation(b);
  if (rules_.strip) a = text::python_strip(a), b = text::python_strip(b);
  return a == b;
}

}  // namespace dstrain::data
