#include "dstrain/model/generation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "dstrain/model/causal_lm.h"
#include "dstrain/model/kv_cache.h"

namespace dstrain::model {
namespace {

// The last position's logits [B, V] of a forward.
at::Tensor last_logits(const CausalLM& model, const CausalLM::Input& input) {
  const CausalLM::Hidden h = model.hidden_states(input, /*with_aux=*/false);
  const at::Tensor last = h.hidden.select(1, h.hidden.size(1) - 1);
  return model.close(h, at::linear(last, h.head)).to(at::kFloat);
}

// Left padding's positions, as transformers makes them: each row's tokens count from 0, padding 0.
at::Tensor positions_of(const at::Tensor& valid) { return (valid.to(at::kLong).cumsum(1) - 1).masked_fill(valid.logical_not(), 0); }

}  // namespace

std::vector<Generation> generate(const CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o,
                                 const c10::Device& device) {
  c10::NoGradGuard no_grad;
  const auto B = static_cast<int64_t>(prompts.size());
  int64_t P = 0;
  for (const auto& p : prompts) P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  const int64_t capacity = P + o.max_new_tokens;
  // Everything on the host as [B, capacity]; the forwards take their slices to the device.
  at::Tensor tokens = at::full({B, capacity}, o.pad_id, at::kLong), valid = at::zeros({B, capacity}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(p.size());
    tokens[b].narrow(0, P - n, n).copy_(at::tensor(p, at::kLong));
    valid[b].narrow(0, P - n, n).fill_(true);
  }
  const at::Tensor positions = positions_of(valid);
  std::vector<Generation> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  KvCache cache(model.final_group() - 1, B, capacity);
  int64_t length = P;  // tokens so far in every row (padding included)
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    // The cache takes the tokens it has not seen; without it, a fresh one per step sees them all.
    KvCache fresh(0, B, capacity);
    KvCache& scope_of = o.use_cache ? cache : fresh;
    const int64_t from = o.use_cache ? cache.length() : 0, n = length - from;
    const AttentionScope scope = scope_of.begin(valid.narrow(1, from, n).to(device), positions.narrow(1, from, n).to(device));
    CausalLM::Input input{tokens.narrow(1, from, n).to(device), scope.positions, scope.mask};
    if (o.use_cache) input.cache = &cache;
    const at::Tensor logits = last_logits(model, input);
    if (o.use_cache) cache.commit();
    if (o.step_logits) o.step_logits->push_back(logits.cpu());
    // The row so far goes to the device only for the repetition penalty, which reads it.
    const at::Tensor seen = o.sampling.repetition_penalty != 1.0 ? tokens.narrow(1, 0, length).to(device) : at::Tensor();
    const at::Tensor next = next_tokens(logits, seen, o.sampling, generator).cpu();
    for (int64_t b = 0; b < B; ++b) {
      const auto r = static_cast<size_t>(b);
      const int64_t token = done[r] ? o.pad_id : next[b].item<int64_t>();
      tokens[b][length] = token;
      valid[b][length] = true;  // finished rows too, as transformers extends the mask of every row
      if (done[r]) continue;
      out[r].tokens.push_back(token);
      if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) {
        done[r] = true, out[r].finish_reason = "stop", out[r].stopped_by_id = true;
      } else if (o.stop_check && o.stop_check(r, out[r].tokens)) {
        done[r] = true, out[r].finish_reason = "stop";
      }
    }
    positions.select(1, length).copy_(positions.select(1, length - 1) + 1);
    ++length;
    const bool running = !std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    if (o.any_running ? !o.any_running(running) : !running) break;
  }
  for (auto& g : out)
    if (g.finish_reason.empty()) g.finish_reason = "length";
  return out;
}

}  // namespace dstrain::model
