#pragma once
// The next token from a forward's last logits, as transformers' generate() chooses it: the
// processors in its order (repetition penalty, then temperature, top-k, top-p), then the argmax
// (greedy: temperature 0) or one draw from the softmax with the caller's generator.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dstrain::model {

struct SamplingOptions {
  double temperature = 0.0;         // 0: greedy (no draw; top-k and top-p do not change the argmax)
  int64_t top_k = 0;                // 0: off
  double top_p = 1.0;               // 1: off
  double repetition_penalty = 1.0;  // 1: off
  bool greedy() const { return temperature == 0.0; }
};

// RepetitionPenaltyLogitsProcessor: each token already in the row (`seen` int64 [B, n], prompt and
// generated tokens) has its logit divided by the penalty when positive, multiplied when negative.
at::Tensor apply_repetition_penalty(const at::Tensor& logits, const at::Tensor& seen, double penalty);
// TopKLogitsWarper: -inf below the k-th largest logit (ties with it stay).
at::Tensor apply_top_k(const at::Tensor& logits, int64_t k);
// TopPLogitsWarper: -inf for the smallest logits whose probabilities sum to at most 1 - p; the
// most likely token always stays.
at::Tensor apply_top_p(const at::Tensor& logits, double p);
// The processed logits [B, V] (fp32) as the draw sees them.
at::Tensor process_logits(const at::Tensor& logits, const at::Tensor& seen, const SamplingOptions& options);
// int64 [B]: the argmax, or a draw from softmax(process_logits) with `generator`.
at::Tensor next_tokens(const at::Tensor& logits, const at::Tensor& seen, const SamplingOptions& options, at::Generator& generator);

}  // namespace dstrain::model
