#include "dstrain/tasks/choice_scoring.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "dstrain/config/recipe.h"
#include "dstrain/tasks/eval_target.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;

std::string encode_choice_tasks(const std::vector<std::string>& paths, const std::string& tokenizer_dir, const EvalTarget& target,
                                const config::Recipe& r, data::TaskFormat format) {
  const std::string dir = target_tokenizer_dir(tokenizer_dir, target, r, "--task");
  const std::shared_ptr<const text::Tokenizer> tokenizer = text::Tokenizer::load(dir);
  std::vector<data::ChoiceTask> tasks;
  for (const std::string& path : paths)
    tasks.push_back(data::read_choice_task(path, fs::path(path).stem().string(), *tokenizer, dir, r.model.max_seq_len, format));
  return data::choice_tasks_json(tasks);
}

std::string choice_tasks_table(const std::string& result_json) {
  const nlohmann::json j = nlohmann::json::parse(result_json);
  size_t width = 4;
  for (const auto& t : j.at("tasks")) width = std::max(width, t.at("name").get<std::string>().size());
  std::string out = fmt::format("{:<{}}  {:>8}  {:>8}  {:>9}  {:>9}\n", "task", width, "acc", "acc_norm", "questions", "requests");
  for (const auto& t : j.at("tasks"))
    out += fmt::format("{:<{}}  {:>8.4f}  {:>8.4f}  {:>9}  {:>9}\n", t.at("name").get<std::string>(), width, t.at("acc").get<double>(),
                       t.at("acc_norm").get<double>(), t.at("n").get<int64_t>(), t.at("requests").get<int64_t>());
  return out;
}

}  // namespace dstrain::tasks
