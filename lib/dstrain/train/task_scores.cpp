#include "dstrain/train/task_scores.h"

#include <nlohmann/json.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/train/choice_scores.h"
#include "dstrain/train/generative_scores.h"

namespace dstrain::train {

data::TaskSet read_eval_tasks(const config::Recipe& r) {
  if (r.eval.tasks.empty()) return {};
  const std::string dir = run_tokenizer_dir(r);
  const std::optional<int64_t> byte_end = dir.empty() ? byte_level_end(r) : std::nullopt;
  if (dir.empty() && !byte_end)
    throw Error(ErrorCode::kConfig,
                "eval.tasks needs the model's tokenizer: neither model.init_from (a folder with tokenizer.json) nor the training data "
                "(prepare-data --tokenizer) names one",
                "train on data prepare-data tokenized (--tokenizer), or from a Hugging Face folder with its tokenizer");
  data::TaskSet set =
      data::read_task_set(r.eval.tasks, dir, byte_end.value_or(-1), r.model.max_seq_len, r.eval.task_format, {},
                          "eval.tasks: score a run trained on bytes with generative tasks ({\"context\", \"target\"} rows), or "
                          "train on data prepare-data tokenized (--tokenizer)");
  set.batch_size = r.eval.task_batch_size;
  return set;
}

TaskResults score_tasks(const data::TaskSet& tasks, const model::CausalLM& model, int64_t max_length, const c10::Device& device,
                        comm::Communicator& comm, int64_t step) {
  TaskResults all;
  if (!tasks.choice.empty())
    all = score_choice_tasks(tasks.choice, model, max_length, device, comm, step);
  else
    all.json = nlohmann::json{{"step", step >= 0 ? nlohmann::json(step) : nlohmann::json(nullptr)},
                              {"world_size", comm.world_size()},
                              {"tasks", nlohmann::json::array()}}
                   .dump();
  if (tasks.generative.empty()) return all;
  const TaskResults generative = score_generative_tasks(tasks, model, device, comm);
  nlohmann::json j = nlohmann::json::parse(all.json);
  for (const auto& t : nlohmann::json::parse(generative.json)) j["tasks"].push_back(t);
  all.json = j.dump();
  all.samples += generative.samples;
  all.scores.insert(all.scores.end(), generative.scores.begin(), generative.scores.end());
  return all;
}

}  // namespace dstrain::train
