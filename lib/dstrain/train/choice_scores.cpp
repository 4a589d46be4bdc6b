#include "dstrain/train/choice_scores.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::train {
namespace {

namespace fs = std::filesystem;

double loglikelihood(const model::CausalLM& model, const data::ChoiceRequest& r, int64_t max_length, const c10::Device& device) {
  std::vector<int64_t> whole(r.context.begin(), r.context.end());
  whole.insert(whole.end(), r.continuation.begin(), r.continuation.end());
  const auto keep = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(whole.size()), max_length + 1));
  const std::vector<int64_t> input(whole.end() - static_cast<std::ptrdiff_t>(keep), whole.end() - 1);
  const auto T = static_cast<int64_t>(input.size()), n = static_cast<int64_t>(r.continuation.size());
  const at::Tensor tokens = at::tensor(input, at::kLong).view({1, T}).to(device);
  // The head on the continuation's positions only: log_softmax is per position, so these rows
  // are lm-eval's slice of its whole [T, V].
  const model::CausalLM::Hidden h = model.hidden_states(model::CausalLM::Input{tokens, {}, {}}, /*with_aux=*/false);
  const at::Tensor logp = at::log_softmax(model.close(h, at::linear(h.hidden[0].narrow(0, T - n, n), h.head)), -1);  // [n, V]
  const at::Tensor targets = at::tensor(std::vector<int64_t>(r.continuation.begin(), r.continuation.end()), at::kLong).to(device);
  return logp.gather(1, targets.unsqueeze(1)).sum().item<double>();
}

}  // namespace

std::vector<double> request_loglikelihoods(const model::CausalLM& model, const std::vector<const data::ChoiceRequest*>& requests,
                                           int64_t max_length, const c10::Device& device, comm::Communicator& comm) {
  c10::NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(requests.size());
  const int64_t world = comm.world_size(), rounds = (n + world - 1) / world;
  at::Tensor table = at::zeros({n}, at::kDouble);
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t i = round * world + comm.rank();
    // A rank past the end scores the last request again and keeps nothing: its forward pairs up
    // with the others' (the routed experts' all-to-alls).
    const double value = loglikelihood(model, *requests[static_cast<size_t>(std::min(i, n - 1))], max_length, device);
    if (i < n) table.data_ptr<double>()[i] = value;
  }
  comm::all_reduce_host(comm, table);
  return std::vector<double>(table.data_ptr<double>(), table.data_ptr<double>() + n);
}

TaskResults score_choice_tasks(const std::vector<data::ChoiceTask>& tasks, const model::CausalLM& model, int64_t max_length,
                               const c10::Device& device, comm::Communicator& comm, int64_t step) {
  std::vector<const data::ChoiceRequest*> requests;
  for (const data::ChoiceTask& t : tasks)
    for (const data::ChoiceQuestion& q : t.questions)
      for (const data::ChoiceRequest& r : q.requests) requests.push_back(&r);
  const std::vector<double> all = request_loglikelihoods(model, requests, max_length, device, comm);
  nlohmann::json out = {{"step", step >= 0 ? nlohmann::json(step) : nlohmann::json(nullptr)}, {"world_size", comm.world_size()}};
  out["tasks"] = nlohmann::json::array();
  size_t at = 0;
  std::string samples;
  std::vector<TaskScore> scores;
  for (const data::ChoiceTask& t : tasks) {
    const auto n = static_cast<size_t>(t.requests());
    const std::vector<double> lls(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    const data::ChoiceScore s = data::score_choice_task(t, lls);
    out["tasks"].push_back({{"name", t.name}, {"acc", s.acc}, {"acc_norm", s.acc_norm}, {"n", s.n}, {"requests", n}});
    TaskScore score;
    score.name = t.name, score.acc = s.acc, score.acc_norm = s.acc_norm, score.questions = s.n, score.requests = static_cast<int64_t>(n);
    scores.push_back(score);
    size_t first = 0;
    for (size_t q = 0; q < t.questions.size(); ++q) {
      const size_t choices = t.questions[q].requests.size();
      samples += nlohmann::json{{"task", t.name},
                                {"index", q},
                                {"gold", t.questions[q].gold},
                                {"loglikelihoods", std::vector<double>(lls.begin() + static_cast<std::ptrdiff_t>(first),
                                                                       lls.begin() + static_cast<std::ptrdiff_t>(first + choices))},
                                {"pred", s.pred[q]},
                                {"pred_norm", s.pred_norm[q]}}
                     .dump() +
                 "\n";
      first += choices;
    }
  }
  return {out.dump(), samples, scores};
}

std::string run_tokenizer_dir(const config::Recipe& r) {
  if (!r.model.init_from.empty() && fs::is_regular_file(fs::path(r.model.init_from) / "tokenizer.json")) return r.model.init_from;
  if (const auto sidecar = config::read_dataset_sidecar(r.data.sources().front()); sidecar && !sidecar->tokenizer_dir.empty())
    return sidecar->tokenizer_dir;
  return "";
}

std::optional<int64_t> byte_level_end(const config::Recipe& r) {
  if (!run_tokenizer_dir(r).empty()) return std::nullopt;
  const auto sidecar = config::read_dataset_sidecar(r.data.sources().front());
  if (sidecar && sidecar->tokenizer == "bytes+eos") return sidecar->eos;
  if (!sidecar && r.data.format == config::DataFormat::kBytes && r.model.vocab_size <= 257) return int64_t{-1};
  return std::nullopt;
}

}  // namespace dstrain::train
