#include "dstrain/train/generative_scores.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/data/prompts.h"
#include "dstrain/model/generation.h"

namespace dstrain::train {
namespace {

// lm-eval's Collator order: the longest prompt first, equal lengths by their text; batches are
// consecutive runs of it.
std::vector<size_t> longest_first(const data::GenerativeTask& t) {
  std::vector<size_t> order(t.questions.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& qa = t.questions[a];
    const auto& qb = t.questions[b];
    if (qa.prompt.size() != qb.prompt.size()) return qa.prompt.size() > qb.prompt.size();
    return qa.context < qb.context;  // UTF-8 bytes sort as Python compares code points
  });
  return order;
}

// A batch of questions' new tokens, greedy; the stop strings are looked for in each row's text
// with its special tokens (HFLM's stop criteria decode them).
std::vector<model::Generation> generate_batch(const data::GenerativeTask& t, const std::vector<std::vector<int64_t>>& prompts,
                                              const data::TaskSet& set, const data::PromptCodec& codec, const model::CausalLM& model,
                                              const c10::Device& device, comm::Communicator& comm) {
  model::GenerateOptions o;
  o.max_new_tokens = t.max_gen_toks;
  o.sampling.temperature = 0;
  o.stop_ids = set.stop_ids;
  if (!set.stop_ids.empty()) o.pad_id = set.stop_ids.front();
  if (!t.until.empty())
    o.stop_check = [&](size_t, const std::vector<int64_t>& generated) {
      const std::string text = codec.decode(generated);
      return std::any_of(t.until.begin(), t.until.end(), [&](const std::string& s) { return text.find(s) != std::string::npos; });
    };
  if (comm.world_size() > 1)
    o.any_running = [&](bool running) {
      at::Tensor flag = at::full({1}, running ? 1 : 0, at::kLong);
      comm::all_reduce_host(comm, flag);
      return flag.item<int64_t>() > 0;
    };
  return model::generate(model, prompts, o, device);
}

// HFLM's text of a generation: special tokens skipped, cut before every stop string in turn.
std::string text_of(std::vector<int64_t> tokens, const data::GenerativeTask& t, const data::TaskSet& set, const data::PromptCodec& codec) {
  if (!tokens.empty() && std::find(set.stop_ids.begin(), set.stop_ids.end(), tokens.back()) != set.stop_ids.end()) tokens.pop_back();
  std::string text = codec.decode(tokens, /*skip_special_tokens=*/true);
  for (const std::string& stop : t.until)
    if (!stop.empty()) text = text.substr(0, std::min(text.size(), text.find(stop)));
  return text;
}

// Every question's new tokens on every rank: row i holds its count, then the tokens. Batch k runs
// on rank k % world (lm-eval's batches at any world size); the rows are summed over the ranks.
at::Tensor generate_all(const data::GenerativeTask& t, const data::TaskSet& set, const data::PromptCodec& codec,
                        const model::CausalLM& model, const c10::Device& device, comm::Communicator& comm) {
  const auto n = static_cast<int64_t>(t.questions.size());
  const int64_t world = comm.world_size(), batches = (n + set.batch_size - 1) / set.batch_size;
  const std::vector<size_t> order = longest_first(t);
  at::Tensor table = at::zeros({n, t.max_gen_toks + 1}, at::kLong);
  for (int64_t round = 0; round < (batches + world - 1) / world; ++round) {
    // A rank past the end generates the last batch again and keeps nothing: its forwards pair up
    // with the others'.
    const int64_t k = round * world + comm.rank(), first = std::min(k, batches - 1) * set.batch_size;
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t j = first; j < std::min(first + set.batch_size, n); ++j)
      prompts.push_back(t.questions[order[static_cast<size_t>(j)]].prompt);
    const std::vector<model::Generation> rows = generate_batch(t, prompts, set, codec, model, device, comm);
    if (k >= batches) continue;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<int64_t>& tokens = rows[r].tokens;
      const auto i = static_cast<int64_t>(order[static_cast<size_t>(first) + r]);
      table[i][0] = static_cast<int64_t>(tokens.size());
      table[i].narrow(0, 1, static_cast<int64_t>(tokens.size())).copy_(at::tensor(tokens, at::kLong));
    }
  }
  comm::all_reduce_host(comm, table);
  return table;
}

}  // namespace

TaskResults score_generative_tasks(const data::TaskSet& set, const model::CausalLM& model, const c10::Device& device,
                                   comm::Communicator& comm) {
  const data::PromptCodec codec(set.tokenizer_dir, set.end_of_document);
  TaskResults out;
  nlohmann::json tasks = nlohmann::json::array();
  for (const data::GenerativeTask& t : set.generative) {
    const auto start = std::chrono::steady_clock::now();
    const auto n = static_cast<int64_t>(t.questions.size());
    const at::Tensor table = generate_all(t, set, codec, model, device, comm);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::vector<double> correct(t.filters.size(), 0.0);
    const data::AnswerScorer scorer(t.filters, t.rules);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* row = table[i].data_ptr<int64_t>();
      const std::string text = text_of(std::vector<int64_t>(row + 1, row + 1 + row[0]), t, set, codec);
      const data::GenerativeQuestion& q = t.questions[static_cast<size_t>(i)];
      nlohmann::json answers = nlohmann::json::object(), scores = nlohmann::json::object();
      for (size_t f = 0; f < t.filters.size(); ++f) {
        const std::string answer = scorer.answer(f, text);
        const bool match = scorer.matches(answer, q.target);
        correct[f] += match;
        answers[t.filters[f].metric] = answer, scores[t.filters[f].metric] = match ? 1 : 0;
      }
      out.samples += nlohmann::json{{"task", t.name},     {"index", i},       {"target", q.target},  {"generation", text},
                                    {"answers", answers}, {"scores", scores}, {"new_tokens", row[0]}}
                         .dump() +
                     "\n";
    }
    TaskScore score;
    score.name = t.name, score.questions = n, score.requests = n;
    nlohmann::json entry = {{"name", t.name}};
    for (size_t f = 0; f < t.filters.size(); ++f) {
      const double value = correct[f] / static_cast<double>(n);
      entry[t.filters[f].metric] = value;
      (f == 0 ? score.exact_match : score.exact_match_flexible) = value;
    }
    entry["n"] = n, entry["requests"] = n, entry["eval_ms"] = ms;
    tasks.push_back(entry);
    out.scores.push_back(score);
  }
  out.json = tasks.dump();
  return out;
}

}  // namespace dstrain::train
