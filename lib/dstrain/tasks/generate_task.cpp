#include "dstrain/tasks/generate_task.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/data/prompts.h"

namespace dstrain::tasks {
namespace {

struct Prompt {
  std::string where;  // "--prompt 2" or FILE:LINE, for messages
  bool from_file = false;
  std::vector<int64_t> ids;
};

std::vector<Prompt> read_prompts(const GenerateRequest& r, GenerationSession& session) {
  std::vector<Prompt> out;
  for (size_t i = 0; i < r.prompts.size(); ++i)
    out.push_back({fmt::format("--prompt {}", i + 1), false, session.encode_text(r.prompts[i])});
  if (!r.prompts_file.empty())
    for (data::Prompt& p : data::read_prompts(r.prompts_file, session.codec())) out.push_back({p.where, true, std::move(p.ids)});
  return out;
}

void check_prompts(const std::vector<Prompt>& prompts, int64_t max_new, int64_t context) {
  if (prompts.empty()) throw Error(ErrorCode::kUsage, "nothing to generate from", "pass --prompt TEXT or --prompts FILE");
  for (const Prompt& p : prompts) {
    const auto code = p.from_file ? ErrorCode::kData : ErrorCode::kUsage;
    if (p.ids.empty()) throw Error(code, fmt::format("{}: the prompt is empty (no tokens)", p.where), "give every prompt some text");
    const auto n = static_cast<int64_t>(p.ids.size());
    if (n + max_new > context)
      throw Error(
          code,
          fmt::format("{}: {} prompt tokens and --max-new-tokens {} make {}, more than the model's {} positions (max_seq_len)", p.where, n,
                      max_new, n + max_new, context),
          n >= context ? "shorten the prompt" : fmt::format("pass --max-new-tokens {} or less, or shorten the prompt", context - n));
  }
}

}  // namespace

int run_generate(const GenerateRequest& r) {
  GenerationSession session(r, "dstrain generate");
  const std::vector<Prompt> prompts = read_prompts(r, session);
  check_prompts(prompts, session.max_new_tokens(), session.context());
  log::info(fmt::format("generating with {}, {} prompt{}, up to {} new tokens each", session.describe(), prompts.size(),
                        prompts.size() == 1 ? "" : "s", session.max_new_tokens()));
  const int64_t batch = r.stream ? 1 : std::max<int64_t>(1, r.batch_size);
  int64_t total_new = 0;
  double total_s = 0;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(batch)) {
    const size_t n = std::min(prompts.size() - first, static_cast<size_t>(batch));
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = 0; i < n; ++i) ids.push_back(prompts[first + i].ids);
    const GenerationSession::Batch out = session.run(ids, r.stream);
    total_s += out.seconds;
    for (size_t i = 0; i < n; ++i) {
      const model::Generation& g = out.rows[i];
      total_new += static_cast<int64_t>(g.tokens.size());
      const std::string text = session.text_of(g);
      if (r.json) {
        const nlohmann::json j = {{"index", first + i},
                                  {"prompt_tokens", ids[i].size()},
                                  {"text", text},
                                  {"token_ids", g.tokens},
                                  {"finish_reason", g.finish_reason},
                                  {"tokens_per_s", out.seconds > 0 ? static_cast<double>(g.tokens.size()) / out.seconds : 0.0}};
        std::fputs((j.dump() + "\n").c_str(), stdout);
      } else if (r.stream) {
        std::fputs("\n", stdout);
      } else {
        if (prompts.size() > 1)
          std::fputs(fmt::format("--- {} ({} tokens, {})\n", prompts[first + i].where, g.tokens.size(), g.finish_reason).c_str(), stdout);
        std::fputs((text + "\n").c_str(), stdout);
      }
      std::fflush(stdout);
    }
  }
  log::info(fmt::format("{} new tokens in {:.2f} s: {:.1f} tokens/s", total_new, total_s, total_s > 0 ? total_new / total_s : 0.0));
  return exit_status::kOk;
}

}  // namespace dstrain::tasks
