#include "dstrain/data/choice_task.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "dstrain/core/error.h"
#include "dstrain/data/json_lines.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/python_str.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::data {
namespace {

using Json = nlohmann::json;

double characters(const std::string& s) {
  return static_cast<double>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// HFLM's tokenization of loglikelihood requests.
class RequestEncoder {
 public:
  RequestEncoder(const text::Tokenizer& tokenizer, const std::string& tokenizer_dir) : tokenizer_(tokenizer) {
    text::ChatTemplateSource special;
    text::read_special_tokens(tokenizer_dir, special);
    std::optional<uint32_t> prefix = special.bos_token.empty() ? std::nullopt : tokenizer.token_id(special.bos_token);
    if (!prefix && !special.eos_token.empty()) prefix = tokenizer.token_id(special.eos_token);
    if (!prefix) prefix = tokenizer.default_end_of_document();
    if (!prefix)
      throw Error(ErrorCode::kData, fmt::format("{}: no bos_token or eos_token to condition an empty context on", tokenizer.json_path()),
                  "give the tokenizer folder a tokenizer_config.json that names them");
    prefix_ = *prefix;
    prefix_text_ = tokenizer.decode({prefix_});
  }

  // tok_encode: the tokenizer's special tokens, unless the text already starts with the prefix token.
  std::vector<uint32_t> encode(const std::string& text) {
    std::vector<uint32_t> ids;
    const bool starts_with_prefix = !prefix_text_.empty() && text.compare(0, prefix_text_.size(), prefix_text_) == 0;
    tokenizer_.encode(text, ids, session_, !starts_with_prefix);
    return ids;
  }

  ChoiceRequest request(std::string context, std::string continuation) {
    ChoiceRequest r;
    if (context.empty()) {  // loglikelihood(): the prefix token as the context
      std::vector<uint32_t> ids;
      tokenizer_.encode(continuation, ids, session_, false);
      if (!ids.empty() && ids.front() == prefix_) {
        r.context.assign(ids.begin(), ids.begin() + 1), r.continuation.assign(ids.begin() + 1, ids.end());
      } else {
        r.context = {prefix_}, r.continuation = std::move(ids);
      }
      return r;
    }
    const size_t kept = text::python_rstrip_end(context);
    continuation = context.substr(kept) + continuation, context.resize(kept);
    const std::vector<uint32_t> whole = encode(context + continuation);
    r.context = encode(context);
    r.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(std::min(r.context.size(), whole.size())), whole.end());
    return r;
  }

 private:
  const text::Tokenizer& tokenizer_;
  text::Tokenizer::Session session_;
  uint32_t prefix_ = 0;
  std::string prefix_text_;
};

// Python's str.replace(from, to): every non-overlapping occurrence, left to right.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) out += s.substr(at, hit - at) + to;
  return out + s.substr(at);
}

// lm-eval's tasks/hellaswag/utils.py preprocess().
std::string hellaswag_preprocess(const std::string& text) {
  static const std::regex kBrackets("\\[.*?\\]");
  std::string t = replace_all(text::python_strip(text), " [title]", ". ");
  t = std::regex_replace(t, kBrackets, "");
  return replace_all(t, "  ", " ");
}

// str.capitalize() on ASCII letters: the first upper case, the rest lower.
std::string capitalize(std::string s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) < 0x80) s[i] = static_cast<char>(i == 0 ? std::toupper(s[i]) : std::tolower(s[i]));
  return s;
}

const Json& field(const Json& row, const char* key, bool (Json::*is)() const noexcept, const char* what) {
  if (!row.contains(key) || !(row[key].*is)()) throw std::invalid_argument(fmt::format("\"{}\" is missing or not {}", key, what));
  return row[key];
}

// A downloaded dataset's row as the dstrain row lm-eval's task definition makes of it.
Json dstrain_row(const Json& row, TaskFormat format) {
  if (format == TaskFormat::kDstrain) return row;
  if (!row.is_object()) throw std::invalid_argument("a row is a JSON object");
  Json out = Json::object();
  if (format == TaskFormat::kHellaswag) {
    const std::string ctx = field(row, "ctx_a", &Json::is_string, "a string").get<std::string>() + " " +
                            capitalize(field(row, "ctx_b", &Json::is_string, "a string").get<std::string>());
    out["context"] = hellaswag_preprocess(field(row, "activity_label", &Json::is_string, "a string").get<std::string>() + ": " + ctx);
    out["choices"] = Json::array();
    for (const Json& e : field(row, "endings", &Json::is_array, "a list"))
      out["choices"].push_back(hellaswag_preprocess(e.is_string() ? e.get<std::string>() : e.dump()));
    const Json& label = row.contains("label") ? row["label"] : Json();
    if (label.is_string() && !label.get<std::string>().empty() &&
        label.get<std::string>().find_first_not_of("0123456789") == std::string::npos)
      out["gold"] = std::stoll(label.get<std::string>());
    else
      out["gold"] = label;  // checked as gold below
  } else if (format == TaskFormat::kArc) {
    out["context"] = "Question: " + field(row, "question", &Json::is_string, "a string").get<std::string>() + "\nAnswer:";
    const Json& choices = field(row, "choices", &Json::is_object, "an object {text, label}");
    if (!choices.contains("text") || !choices.contains("label") || !choices["label"].is_array())
      throw std::invalid_argument("\"choices\" has no \"text\" and \"label\" lists");
    out["choices"] = choices["text"];
    const Json& key = field(row, "answerKey", &Json::is_string, "a string");
    const auto at = std::find(choices["label"].begin(), choices["label"].end(), key);
    if (at == choices["label"].end())
      throw std::invalid_argument(fmt::format("\"answerKey\" {} is none of the labels {}", key.dump(), choices["label"].dump()));
    out["gold"] = at - choices["label"].begin();
  } else {
    const Json& choices = field(row, "choices", &Json::is_array, "a list");
    if (choices.size() != 4 || !std::all_of(choices.begin(), choices.end(), [](const Json& c) { return c.is_string(); }))
      throw std::invalid_argument("\"choices\" is not 4 strings (MMLU's A to D)");
    std::string context = text::python_strip(field(row, "question", &Json::is_string, "a string").get<std::string>());
    for (size_t i = 0; i < 4; ++i) context += fmt::format("\n{}. {}", static_cast<char>('A' + i), choices[i].get<std::string>());
    out["context"] = context + "\nAnswer:";
    out["choices"] = {"A", "B", "C", "D"};
    out["gold"] = row.contains("answer") ? row["answer"] : Json();
  }
  return out;
}

ChoiceQuestion question_of(const Json& row, RequestEncoder& encoder, int64_t max_length) {
  if (!row.is_object()) throw std::invalid_argument("a task row is an object {\"context\", \"choices\", \"gold\"}");
  if (!row.contains("context") || !row["context"].is_string()) throw std::invalid_argument("\"context\" is missing or not a string");
  if (!row.contains("choices") || !row["choices"].is_array() || row["choices"].empty())
    throw std::invalid_argument("\"choices\" is missing or not a non-empty list of strings");
  for (const Json& c : row["choices"])
    if (!c.is_string()) throw std::invalid_argument(fmt::format("a choice is {}, not a string", c.type_name()));
  if (!row.contains("gold") || !row["gold"].is_number_integer()) throw std::invalid_argument("\"gold\" is missing or not an integer");
  const int64_t n = static_cast<int64_t>(row["choices"].size()), gold = row["gold"].get<int64_t>();
  if (gold < 0 || gold >= n) throw std::invalid_argument(fmt::format("\"gold\" is {}, outside the {} choices (0 to {})", gold, n, n - 1));
  ChoiceQuestion q;
  q.gold = gold;
  for (const Json& c : row["choices"]) {
    const std::string choice = c.get<std::string>();
    q.choice_chars.push_back(std::max(characters(choice), 1.0));  // an empty choice: lm-eval would divide by 0
    q.requests.push_back(encoder.request(row["context"].get<std::string>(), " " + choice));
    const ChoiceRequest& r = q.requests.back();
    if (r.context.empty()) throw std::invalid_argument("the context gives no token once its trailing whitespace moves to the choices");
    if (r.continuation.empty()) throw std::invalid_argument(fmt::format("choice {} adds no token to the context", q.requests.size() - 1));
    if (static_cast<int64_t>(r.continuation.size()) > max_length)
      throw std::invalid_argument(fmt::format("choice {} is {} tokens, more than the model's context of {}", q.requests.size() - 1,
                                              r.continuation.size(), max_length));
  }
  return q;
}

}  // namespace

int64_t ChoiceTask::requests() const {
  int64_t n = 0;
  for (const ChoiceQuestion& q : questions) n += static_cast<int64_t>(q.requests.size());
  return n;
}

TaskFormat task_format(const std::string& name) {
  if (name == "dstrain") return TaskFormat::kDstrain;
  if (name == "hellaswag") return TaskFormat::kHellaswag;
  if (name == "arc") return TaskFormat::kArc;
  if (name == "mmlu") return TaskFormat::kMmlu;
  if (name == "gsm8k") return TaskFormat::kGsm8k;
  throw Error(ErrorCode::kUsage, fmt::format("--task-format '{}' is not one of dstrain, hellaswag, arc, mmlu, gsm8k", name), "");
}

ChoiceTask read_choice_task(const std::string& path, const std::string& name, const text::Tokenizer& tokenizer,
                            const std::string& tokenizer_dir, int64_t max_length, TaskFormat format) {
  RequestEncoder encoder(tokenizer, tokenizer_dir);
  ChoiceTask task{name, path, {}};
  for_each_json_line(path, "each row is {\"context\": \"...\", \"choices\": [\"...\", ...], \"gold\": INDEX}",
                     "pass a JSON Lines file to --task", [&](const std::string& line) {
                       const Json row = Json::parse(line, nullptr, false);
                       if (row.is_discarded()) throw std::invalid_argument("not valid JSON");
                       task.questions.push_back(question_of(dstrain_row(row, format), encoder, max_length));
                     });
  if (task.questions.empty())
    throw Error(ErrorCode::kData, fmt::format("{}: no task rows", path), "each row is {\"context\", \"choices\", \"gold\"}");
  return task;
}

std::string choice_tasks_json(const std::vector<ChoiceTask>& tasks) {
  Json out = Json::array();
  for (const ChoiceTask& t : tasks) {
    Json questions = Json::array();
    for (const ChoiceQuestion& q : t.questions) {
      Json requests = Json::array();
      for (const ChoiceRequest& r : q.requests) requests.push_back({r.context, r.continuation});
      questions.push_back({{"gold", q.gold}, {"chars", q.choice_chars}, {"requests", requests}});
    }
    out.push_back({{"name", t.name}, {"path", t.path}, {"questions", questions}});
  }
  return out.dump();
}

std::vector<ChoiceTask> choice_tasks_from_json(const std::string& json) {
  const Json all = Json::parse(json);
  std::vector<ChoiceTask> tasks;
  for (const Json& t : all) {
    ChoiceTask task{t.at("name").get<std::string>(), t.at("path").get<std::string>(), {}};
    for (const Json& q : t.at("questions")) {
      ChoiceQuestion question;
      question.gold = q.at("gold").get<int64_t>();
      question.choice_chars = q.at("chars").get<std::vector<double>>();
      for (const Json& r : q.at("requests"))
        question.requests.push_back({r.at(0).get<std::vector<uint32_t>>(), r.at(1).get<std::vector<uint32_t>>()});
      task.questions.push_back(std::move(question));
    }
    tasks.push_back(std::move(task));
  }
  return tasks;
}

ChoiceScore score_choice_task(const ChoiceTask& task, const std::vector<double>& ll) {
  if (static_cast<int64_t>(ll.size()) != task.requests())
    throw Error(ErrorCode::kInternal, fmt::format("{} log-likelihoods for the {} requests of {}", ll.size(), task.requests(), task.name),
                "report this as a bug");
  ChoiceScore s;
  size_t at = 0;
  for (const ChoiceQuestion& q : task.questions) {
    size_t best = 0, best_norm = 0;
    for (size_t c = 0; c < q.requests.size(); ++c) {  // strictly greater: the first of equals wins, as np.argmax
      if (ll[at + c] > ll[at + best]) best = c;
      if (ll[at + c] / q.choice_chars[c] > ll[at + best_norm] / q.choice_chars[best_norm]) best_norm = c;
    }
    s.acc += static_cast<int64_t>(best) == q.gold, s.acc_norm += static_cast<int64_t>(best_norm) == q.gold;
    s.pred.push_back(static_cast<int64_t>(best)), s.pred_norm.push_back(static_cast<int64_t>(best_norm));
    at += q.requests.size();
  }
  s.n = static_cast<int64_t>(task.questions.size());
  s.acc /= static_cast<double>(s.n), s.acc_norm /= static_cast<double>(s.n);
  return s;
}

}  // namespace dstrain::data
