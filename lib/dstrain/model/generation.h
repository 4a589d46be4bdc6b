#pragma once
// Autoregressive generation from a CausalLM: a batch of prompts of different lengths, left-padded
// as transformers' generate() pads them (positions counted from each row's first token), one
// forward over the prompts and then one per new token against the key/value cache
// (model/kv_cache.h), or the whole sequence again at every token without it (use_cache false:
// the reference the cache is checked against). Rows stop at a stop id, at the caller's stop
// check (stop strings), or after max_new_tokens.
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/model/sampling.h"

namespace at {
class Tensor;
}

namespace dstrain::model {

class CausalLM;

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  uint64_t seed = 0;              // the draw's generator (sampling only)
  std::vector<int64_t> stop_ids;  // end of sequence / end of turn: the row stops after one
  int64_t pad_id = 0;             // what left padding and finished rows are filled with (never attended to)
  bool use_cache = true;
  // After each new token of a row that has not stopped: its new tokens so far; true stops the row
  // (a stop string appeared). May be empty.
  std::function<bool(size_t row, const std::vector<int64_t>& generated)> stop_check;
  // Ranks that generate different prompts through forwards with collectives in them (ZeRO-3's
  // gathers, the experts' all-to-alls) must run as many forwards: after each step, given whether
  // this call still has a row running, whether any rank has (an all-reduce). Empty: this call's
  // rows alone decide.
  std::function<bool(bool running)> any_running;
  // Each step's logits [B, V] before the processors (tests compare the cached and uncached paths).
  std::vector<at::Tensor>* step_logits = nullptr;
};

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens, a stop id included
  std::string finish_reason;    // "stop" (a stop id or the stop check) or "length"
  bool stopped_by_id = false;   // the last token is a stop id
};

// Runs without gradients on `device` (where the model's weights are). The caller checked that
// every prompt is non-empty and that prompt + max_new_tokens fits the model's positions.
std::vector<Generation> generate(const CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& options,
                                 const c10::Device& device);

}  // namespace dstrain::model
