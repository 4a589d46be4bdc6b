#include "dstrain/data/task_set.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/core/error.h"
#include "dstrain/data/prompts.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::data {

TaskSet read_task_set(const std::vector<std::string>& paths, const std::string& tokenizer_dir, int64_t end_of_document, int64_t max_length,
                      config::TaskFormat format, const std::vector<int64_t>& stop_ids, const std::string& no_tokenizer_hint) {
  TaskSet set;
  set.tokenizer_dir = tokenizer_dir, set.end_of_document = end_of_document;
  const PromptCodec codec(tokenizer_dir, end_of_document);
  if (codec.end_of_sequence() >= 0) set.stop_ids.push_back(codec.end_of_sequence());
  for (const int64_t id : stop_ids)
    if (std::find(set.stop_ids.begin(), set.stop_ids.end(), id) == set.stop_ids.end()) set.stop_ids.push_back(id);
  for (const std::string& path : paths) {
    const std::string name = std::filesystem::path(path).stem().string();
    if (is_generative_task_file(path, format)) {
      set.generative.push_back(read_generative_task(path, name, codec, max_length, format));
      continue;
    }
    if (tokenizer_dir.empty())
      throw Error(
          ErrorCode::kConfig,
          fmt::format("{}: a multiple-choice task needs the model's tokenizer, and this model has none (it was trained on bytes)", path),
          no_tokenizer_hint);
    set.choice.push_back(read_choice_task(path, name, *codec.tokenizer(), tokenizer_dir, max_length, format));
  }
  return set;
}

std::string task_set_json(const TaskSet& set) {
  return nlohmann::json{{"choice", nlohmann::json::parse(choice_tasks_json(set.choice))},
                        {"generative", nlohmann::json::parse(generative_tasks_json(set.generative))},
                        {"tokenizer_dir", set.tokenizer_dir},
                        {"end_of_document", set.end_of_document},
                        {"stop_ids", set.stop_ids},
                        {"batch_size", set.batch_size}}
      .dump();
}

TaskSet task_set_from_json(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json);
  TaskSet set;
  set.choice = choice_tasks_from_json(j.at("choice").dump());
  set.generative = generative_tasks_from_json(j.at("generative").dump());
  set.tokenizer_dir = j.at("tokenizer_dir").get<std::string>();
  set.end_of_document = j.at("end_of_document").get<int64_t>();
  set.stop_ids = j.at("stop_ids").get<std::vector<int64_t>>();
  set.batch_size = j.at("batch_size").get<int64_t>();
  return set;
}

}  // namespace dstrain::data
