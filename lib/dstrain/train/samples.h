#pragma once
// eval.samples: text the model writes at each evaluation, from the prompts of a JSON Lines file
// ({"prompt": TEXT} or {"messages": [...]}, as dstrain generate reads them), with the run's
// tokenizer (or its bytes). Every rank generates every prompt (the same forwards, so ZeRO-3's
// gathers and the experts' all-to-alls pair up, and the same tokens); rank 0 writes them.
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::data {
class PromptCodec;
struct Prompt;
}  // namespace dstrain::data
namespace dstrain::model {
class CausalLM;
}
namespace dstrain::train {

struct Sample {
  int64_t index = 0;
  std::string prompt, text, finish_reason;
  int64_t tokens = 0;  // new tokens
};

class SampleWriter {
 public:
  // Reads and encodes eval.samples' prompts. Throws Error{kData} naming a line that is no prompt or
  // that leaves no room for eval.sample_tokens in the model's positions, Error{kConfig} for a
  // conversation without a chat template.
  explicit SampleWriter(const config::Recipe& recipe);
  ~SampleWriter();
  // Greedy (eval.sample_temperature 0) or sampled from seed + step, up to eval.sample_tokens each.
  std::vector<Sample> generate(const model::CausalLM& model, const c10::Device& device, int64_t step) const;
  size_t size() const;

 private:
  const config::Recipe& recipe_;
  std::unique_ptr<data::PromptCodec> codec_;
  std::vector<data::Prompt> prompts_;
};

}  // namespace dstrain::train
