#include "dstrain/tasks/task_scoring.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "dstrain/config/recipe.h"
#include "dstrain/tasks/eval_target.h"
#include "dstrain/tasks/generation_session.h"
#include "dstrain/train/choice_scores.h"

namespace dstrain::tasks {

std::string encode_tasks(const std::vector<std::string>& paths, const std::string& tokenizer_dir, const EvalTarget& target,
                         const config::Recipe& r, data::TaskFormat format, int64_t batch_size) {
  // A run trained on bytes reads its tasks as bytes; anything else needs its tokenizer.
  const std::optional<int64_t> bytes = tokenizer_dir.empty() && target.hf_dir.empty() ? train::byte_level_end(r) : std::nullopt;
  const std::string dir = bytes ? "" : target_tokenizer_dir(tokenizer_dir, target, r, "--task");
  data::TaskSet set =
      data::read_task_set(paths, dir, bytes.value_or(-1), r.model.max_seq_len, format,
                          generation_config_eos(target.hf_dir.empty() ? dir : target.hf_dir, r.model.vocab_size),
                          "score a model trained on bytes with generative tasks ({\"context\", \"target\"} rows), or pass --tokenizer DIR");
  set.batch_size = batch_size;
  return data::task_set_json(set);
}

namespace {

std::string cell(const nlohmann::json& t, const char* key) {
  return t.contains(key) && t[key].is_number() ? fmt::format("{:.4f}", t[key].get<double>()) : "-";
}

}  // namespace

std::string tasks_table(const std::string& result_json) {
  const nlohmann::json j = nlohmann::json::parse(result_json);
  size_t width = 4;
  bool choice = false, generative = false, flexible = false;
  for (const auto& t : j.at("tasks")) {
    width = std::max(width, t.at("name").get<std::string>().size());
    choice = choice || t.contains("acc"), generative = generative || t.contains("exact_match");
    flexible = flexible || t.contains("exact_match_flexible");
  }
  std::string out = fmt::format("{:<{}}", "task", width);
  if (choice) out += fmt::format("  {:>8}  {:>8}", "acc", "acc_norm");
  if (generative) out += fmt::format("  {:>11}", "exact_match");
  if (flexible) out += fmt::format("  {:>8}", "flexible");
  out += fmt::format("  {:>9}  {:>9}\n", "questions", "requests");
  for (const auto& t : j.at("tasks")) {
    out += fmt::format("{:<{}}", t.at("name").get<std::string>(), width);
    if (choice) out += fmt::format("  {:>8}  {:>8}", cell(t, "acc"), cell(t, "acc_norm"));
    if (generative) out += fmt::format("  {:>11}", cell(t, "exact_match"));
    if (flexible) out += fmt::format("  {:>8}", cell(t, "exact_match_flexible"));
    out += fmt::format("  {:>9}  {:>9}\n", t.at("n").get<int64_t>(), t.at("requests").get<int64_t>());
  }
  return out;
}

}  // namespace dstrain::tasks
