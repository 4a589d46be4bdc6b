#include "dstrain/tasks/eval_task.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdio>
#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/parallel_groups.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/reference_mode.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/core/threads.h"
#include "dstrain/device/training_device.h"
#include "dstrain/launch/supervisor.h"
#include "dstrain/launch/worker_envs.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/quantized_base.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/reward_loss.h"
#include "dstrain/model/peft_import.h"
#include "dstrain/run/progress_line.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/tasks/task_scoring.h"
#include "dstrain/tasks/comm_task.h"
#include "dstrain/tasks/eval_target.h"
#include "dstrain/tasks/target_weights.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/train/choice_scores.h"
#include "dstrain/train/task_scores.h"
#include "dstrain/train/evaluator.h"
#include "dstrain/train/live_reference.h"
#include "dstrain/train/reference_logps.h"
#include "dstrain/train/sequential_runner.h"
#include "dstrain/zero/engine.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;
namespace {

// preference.reference live: the model with its adapters off (LoRA), or a frozen copy of the
// starting model, made again as training made it and checked against the checkpoint's record of it.
std::unique_ptr<train::LiveReference> live_reference(const config::Recipe& recipe, const EvalTask& task, train::StepRunner& runner,
                                                     model::CausalLM& model, const comm::ParallelGroups& groups, comm::Communicator& gloo,
                                                     const c10::Device& device) {
  if (!config::reads_live_reference(recipe)) return nullptr;
  if (!config::keeps_reference_copy(recipe)) return std::make_unique<train::LiveReference>(recipe, runner, model);
  train::ReferenceIdentity identity(recipe, gloo);
  if (!task.checkpoint.empty()) {
    model::NamedTensors saved = identity.state();
    saved.front().tensor = saved.front().tensor.clone();  // unchanged when the checkpoint has none
    load_checkpoint_weights(task.checkpoint, saved);
    identity.load_state(saved);
  }
  auto copy = train::frozen_starting_model(recipe, groups.expert_parallel.get(), device);
  if (recipe.preference.sync_ref_model && !task.checkpoint.empty()) {  // TR-DPO: the copy as the checkpoint holds it
    c10::NoGradGuard no_grad;
    model::NamedTensors named;
    for (const auto& p : copy->parameters()) named.push_back({train::kReferenceCopyPrefix + p.name, p.tensor});
    load_checkpoint_weights(task.checkpoint, named);
  }
  for (const auto& p : copy->parameters()) p.tensor.set_data(p.tensor.to(device));
  return std::make_unique<train::LiveReference>(recipe, std::move(copy), nullptr, device);
}

nlohmann::json results_json(int64_t step, int world, const std::vector<train::EvalResult>& results) {
  nlohmann::json sets = nlohmann::json::array();
  for (const auto& r : results) {  // windows: of text, or the packed rows of a set of conversations
    nlohmann::json set = {
        {"name", r.name},       {"val_loss", r.loss},
        {"val_ppl", r.ppl},     {"val_tokens", r.tokens},
        {"windows", r.windows}, {"conversations", r.conversations > 0 ? nlohmann::json(r.conversations) : nlohmann::json(nullptr)},
        {"eval_ms", r.ms}};
    if (r.pairs > 0) {  // preference pairs: a loss per pair and TRL's metrics, no perplexity or tokens
      set["val_ppl"] = set["val_tokens"] = set["windows"] = nullptr;
      set["pairs"] = r.pairs;
      set["metrics"] = nlohmann::json::object();
      for (const auto& [name, value] : r.metrics) set["metrics"][name] = value;
    }
    sets.push_back(set);
  }
  return {{"step", step >= 0 ? nlohmann::json(step) : nlohmann::json(nullptr)}, {"world_size", world}, {"datasets", sets}};
}

// A loss that is not a number (a model with NaN weights) is JSON's null: the table says nan.
double number_at(const nlohmann::json& d, const char* key) {
  const auto& v = d.at(key);
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// Sets of preference pairs: the loss per pair and whether the chosen completions win (DPO's
// rewards/accuracies and rewards/margins, a reward model's accuracy and margin).
std::string render_pairs(const nlohmann::json& j, size_t width) {
  const auto& first = *std::find_if(j.at("datasets").begin(), j.at("datasets").end(), [](const auto& d) { return d.contains("pairs"); });
  const bool dpo = first.at("metrics").contains("rewards/accuracies");
  const char* accuracy = dpo ? "rewards/accuracies" : "accuracy";
  const char* margin = dpo ? "rewards/margins" : "margin";
  std::string out =
      fmt::format("{:<{}}  {:>12}  {:>18}  {:>15}  {:>9}  {:>9}\n", "dataset", width, "val_loss", accuracy, margin, "pairs", "time");
  for (const auto& d : j.at("datasets")) {
    if (!d.contains("pairs")) continue;
    const auto& m = d.at("metrics");
    out += fmt::format("{:<{}}  {:>12.6f}  {:>18.4f}  {:>15.4f}  {:>9}  {:>7.2f} s\n", d.at("name").get<std::string>(), width,
                       number_at(d, "val_loss"), number_at(m, accuracy), number_at(m, margin), d.at("pairs").get<int64_t>(),
                       d.at("eval_ms").get<double>() / 1000.0);
  }
  return out;
}

std::string render(const nlohmann::json& j, bool json) {
  if (json) return j.dump() + "\n";
  if (j.contains("tasks")) return tasks_table(j.dump());
  size_t width = 7, pairs = 0;
  for (const auto& d : j.at("datasets")) width = std::max(width, d.at("name").get<std::string>().size()), pairs += d.contains("pairs");
  if (pairs == j.at("datasets").size()) return render_pairs(j, width);
  std::string out =
      fmt::format("{:<{}}  {:>12}  {:>12}  {:>12}  {:>9}  {:>9}\n", "dataset", width, "val_loss", "val_ppl", "tokens", "windows", "time");
  for (const auto& d : j.at("datasets"))
    out += fmt::format("{:<{}}  {:>12.6f}  {:>12.4f}  {:>12}  {:>9}  {:>7.2f} s\n", d.at("name").get<std::string>(), width,
                       number_at(d, "val_loss"), number_at(d, "val_ppl"), d.at("val_tokens").get<int64_t>(), d.at("windows").get<int64_t>(),
                       d.at("eval_ms").get<double>() / 1000.0);
  return out;
}

// Rank 0's progress for the launcher's bar: forwards done of all, this rank's running loss.
train::Evaluator::Progress progress_printer(int64_t total, int world) {
  auto done = std::make_shared<int64_t>(0);
  const auto start = std::chrono::steady_clock::now();
  return [=](const data::EvalSet&, int64_t, int64_t, double token_loss, int64_t tokens) {
    ++*done;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double loss = tokens > 0 ? token_loss / static_cast<double>(tokens) : 0.0;
    const double rate = elapsed > 0 ? static_cast<double>(tokens) * world / elapsed : 0.0;
    std::printf("%s\n", run::encode_line({*done, 0, total, loss, rate, elapsed}).c_str());
    std::fflush(stdout);
  };
}

}  // namespace

std::vector<std::string> eval_task_args(const EvalTask& t) {
  std::vector<std::string> args{"--task",    "eval",
                                "--config",  t.config_path,
                                "--step",    std::to_string(t.step),
                                "--result",  t.result_path,
                                "--timeout", std::to_string(t.timeout_s)};
  if (!t.checkpoint.empty()) args.insert(args.end(), {"--checkpoint", t.checkpoint});
  if (!t.choice_tasks.empty()) args.insert(args.end(), {"--choice-tasks", t.choice_tasks});
  if (!t.samples_path.empty()) args.insert(args.end(), {"--samples", t.samples_path});
  return args;
}

int run_eval_task(const run::WorkerEnv& env, const EvalTask& task) {
  log::set_rank(env.rank);
  at::set_num_threads(env.threads);
  const device::TrainingDevice device = device::open_training_device(env.device, env.rank);
  const config::Recipe recipe = config::read_resolved_config(task.config_path);
  const comm::Endpoint endpoint = comm::endpoint_of(env, std::chrono::seconds(task.timeout_s));
  auto gloo = comm::make_gloo_communicator(endpoint, env.rank, env.world_size);
  const int ep = static_cast<int>(recipe.moe.expert_parallel_size);
  std::unique_ptr<comm::Communicator> nccl;  // the experts' all-to-alls of GPU tensors
  if (ep > 1 && device.device.is_cuda()) {
    comm::Endpoint client = endpoint;
    client.host_store = client.publish_run_id = false;  // done already, through the Gloo communicator
    nccl = comm::make_nccl_communicator(client, env.rank, env.world_size, device.device.index());
  }
  // Every layer on every rank (no pipeline); the experts spread as in training.
  const comm::ParallelGroups groups =
      comm::open_parallel_groups(nccl ? *nccl : *gloo, config::ParallelLayout{env.world_size, 1, std::max(ep, 1)});
  auto model = model::make_model(recipe.model, recipe.seed, model::scalar_type(recipe.precision.dtype), groups.expert_parallel.get());
  load_target_weights(*model, recipe, task.checkpoint, device.device);
  if (!task.choice_tasks.empty()) {  // --task: the tasks alone
    const train::TaskResults r = train::score_tasks(data::task_set_from_json(read_file(task.choice_tasks)), *model,
                                                    recipe.model.max_seq_len, device.device, *gloo, task.step);
    if (env.rank == 0) {
      if (!task.samples_path.empty()) write_file_atomic(task.samples_path, r.samples);
      if (task.result_path.empty())
        std::fputs(render(nlohmann::json::parse(r.json), task.json).c_str(), stdout), std::fflush(stdout);
      else
        write_file_atomic(task.result_path, r.json + "\n");
    }
    gloo->barrier()->wait();
    return exit_status::kOk;
  }
  model::Objective objective(recipe.train.loss_chunk_tokens);
  model::set_pair_loss(objective, recipe.train.objective, recipe.preference);
  train::SequentialRunner runner(*model, objective, nullptr, device.device);
  std::vector<data::EvalSet> sets = data::open_eval_sets(recipe);
  // Pairs are scored against the reference log-probs the run's start made (a set held out by
  // eval.split reads its training set's); the starting model itself may make them.
  std::vector<const data::PreferencePairs*> pairs;
  for (const data::EvalSet& set : sets)  // a reward model scores pairs without a reference
    if (set.pairs() && (recipe.train.objective == config::TrainObjective::kDpo || recipe.train.objective == config::TrainObjective::kKto) &&
        recipe.preference.reference == "precomputed")
      pairs.push_back(static_cast<const data::PreferencePairs*>(&set.source()));
  train::prepare_reference_logps(recipe, pairs, runner, *model, *gloo, task.checkpoint.empty() ? "" : "dstrain eval of a checkpoint");
  train::EvalOptions options = train::eval_options_from(recipe);
  options.sequence_parallel = 1;  // no sequence groups here: each rank scores whole rows, whatever the run trained with
  train::Evaluator evaluator(std::move(sets), options, *model, nullptr, runner, *gloo, *gloo);
  evaluator.set_pair_objective(&objective);
  const std::unique_ptr<train::LiveReference> live = live_reference(recipe, task, runner, *model, groups, *gloo, device.device);
  evaluator.set_live_reference(live.get());
  if (env.rank == 0 && env.progress_line) evaluator.set_progress(progress_printer(evaluator.rounds(), env.world_size));
  const std::vector<train::EvalResult> results = evaluator.evaluate();
  if (env.rank == 0) {
    for (const auto& r : results)
      log::info(fmt::format(
          "eval | {} | val_loss {:.6f} | {} | {:.0f} ms", r.name, r.loss,
          r.pairs > 0
              ? fmt::format("{} {}", r.pairs, recipe.train.objective == config::TrainObjective::kKto ? "KTO examples" : "preference pairs")
          : r.conversations > 0
              ? fmt::format("ppl {:.4f} | {} trained tokens of {} conversations in {} rows", r.ppl, r.tokens, r.conversations, r.windows)
              : fmt::format("ppl {:.4f} | {} tokens in {} windows", r.ppl, r.tokens, r.windows),
          r.ms));
    const nlohmann::json j = results_json(task.step, env.world_size, results);
    if (task.result_path.empty())
      std::fputs(render(j, task.json).c_str(), stdout), std::fflush(stdout);
    else
      write_file_atomic(task.result_path, j.dump() + "\n");
  }
  gloo->barrier()->wait();  // nobody leaves while another still evaluates
  return exit_status::kOk;
}

int evaluate_target(const launch::Topology& topo, const EvalTarget& target, const config::Recipe& recipe, bool json, int timeout_s,
                    const std::string& executable, const std::string& choice_tasks, const std::string& samples_path) {
  const std::string dir = (fs::temp_directory_path() / fmt::format("dstrain-eval-{}", ::getpid())).string();
  fs::create_directories(dir);
  // Removed however this ends, except after a worker failure, whose logs it holds (and names).
  struct Scratch {
    std::string dir;
    bool keep = false;
    ~Scratch() {
      std::error_code ignored;
      if (!keep) fs::remove_all(dir, ignored);
    }
  } scratch{dir};
  EvalTask task;
  task.config_path = dir + "/config.resolved.json";
  config::write_resolved_config(recipe, task.config_path);
  task.checkpoint = target.checkpoint;
  task.step = target.step.value_or(-1);
  task.json = json;
  task.timeout_s = timeout_s;
  if (!choice_tasks.empty()) task.choice_tasks = dir + "/tasks.json", write_file_atomic(task.choice_tasks, choice_tasks);
  task.samples_path = samples_path.empty() ? "" : fs::absolute(samples_path).string();
  const bool rank_mode = topo.mode == launch::Topology::Mode::kRank;
  if (!rank_mode || topo.rank == 0)
    log::info(fmt::format("evaluating {} on {} rank{} ({})", target.describe(), rank_mode ? topo.world_size : topo.world(),
                          (rank_mode ? topo.world_size : topo.world()) == 1 ? "" : "s", config::name(recipe.precision.dtype)));
  if (rank_mode) {
    const run::WorkerEnv env =
        launch::rank_env(topo, topo.shared_run_id(), "", launch::rank_threads(0, topo, online_cores(), node_cores()));
    return run_eval_task(env, task);
  }
  task.result_path = dir + "/result.json";
  const TaskRendezvous rendezvous = task_rendezvous(topo, "eval", std::chrono::seconds(timeout_s));
  launch::SupervisorOptions sup;
  sup.executable = executable;
  sup.worker_args = {"worker"};
  sup.saves_on_stop = false;
  for (const auto& a : eval_task_args(task)) sup.worker_args.push_back(a);
  sup.log_dir = dir;
  sup.progress_bar = ::isatty(STDERR_FILENO) != 0;
  sup.workers = launch::local_worker_envs(topo, rendezvous.port, rendezvous.run_key.substr(0, rendezvous.run_key.rfind('/')), dir,
                                          threads_per_worker(0, topo.nproc_per_node, online_cores()));
  const int status = launch::supervise(sup);
  if (status != 0) {
    scratch.keep = status != exit_status::kInterrupted && status != exit_status::kStopped;
    log::error(fmt::format("dstrain eval could not finish{}", scratch.keep ? fmt::format(" (worker logs in {})", dir) : ""));
    return status;
  }
  if (topo.node_rank == 0) std::fputs(render(nlohmann::json::parse(read_file(task.result_path)), json).c_str(), stdout);
  return exit_status::kOk;
}

}  // namespace dstrain::tasks
