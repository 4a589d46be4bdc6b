#include "dstrain/train/samples.h"

#include <fmt/format.h>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/prompts.h"
#include "dstrain/model/generation.h"
#include "dstrain/train/choice_scores.h"

namespace dstrain::train {

SampleWriter::SampleWriter(const config::Recipe& recipe) : recipe_(recipe) {
  const std::string dir = run_tokenizer_dir(recipe);
  codec_ = std::make_unique<data::PromptCodec>(dir, dir.empty() ? byte_level_end(recipe).value_or(-1) : -1);
  prompts_ = data::read_prompts(recipe.eval.samples, *codec_);
  const int64_t room = recipe.model.max_seq_len - recipe.eval.sample_tokens;
  for (const data::Prompt& p : prompts_) {
    const auto n = static_cast<int64_t>(p.ids.size());
    if (n == 0) throw Error(ErrorCode::kData, fmt::format("{}: the prompt is empty (no tokens)", p.where), "give every prompt some text");
    if (n > room)
      throw Error(ErrorCode::kData,
                  fmt::format("{}: {} prompt tokens and eval.sample_tokens {} make {}, more than the model's {} positions", p.where, n,
                              recipe.eval.sample_tokens, n + recipe.eval.sample_tokens, recipe.model.max_seq_len),
                  "shorten the prompt, or lower eval.sample_tokens");
  }
}

SampleWriter::~SampleWriter() = default;

size_t SampleWriter::size() const { return prompts_.size(); }

std::vector<Sample> SampleWriter::generate(const model::CausalLM& model, const c10::Device& device, int64_t step) const {
  model::GenerateOptions o;
  o.max_new_tokens = recipe_.eval.sample_tokens;
  o.sampling.temperature = recipe_.eval.sample_temperature;
  o.seed = recipe_.seed + static_cast<uint64_t>(step);
  if (codec_->end_of_sequence() >= 0) o.stop_ids = {codec_->end_of_sequence()}, o.pad_id = codec_->end_of_sequence();
  std::vector<std::vector<int64_t>> ids;
  for (const data::Prompt& p : prompts_) ids.push_back(p.ids);
  const std::vector<model::Generation> rows = model::generate(model, ids, o, device);
  std::vector<Sample> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<int64_t> tokens = rows[i].tokens;
    if (rows[i].stopped_by_id) tokens.pop_back();
    out.push_back({static_cast<int64_t>(i), prompts_[i].shown, codec_->decode(tokens), rows[i].finish_reason,
                   static_cast<int64_t>(rows[i].tokens.size())});
  }
  return out;
}

}  // namespace dstrain::train
