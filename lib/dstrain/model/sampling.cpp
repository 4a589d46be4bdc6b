#include "dstrain/model/sampling.h"

#include <ATen/ATen.h>

#include <cmath>

namespace dstrain::model {

at::Tensor apply_repetition_penalty(const at::Tensor& logits, const at::Tensor& seen, double penalty) {
  if (penalty == 1.0 || !seen.defined() || seen.numel() == 0) return logits;
  const at::Tensor score = logits.gather(1, seen);
  const at::Tensor penalised = at::where(score < 0, score * penalty, score / penalty);
  return logits.scatter(1, seen, penalised);
}

at::Tensor apply_top_k(const at::Tensor& logits, int64_t k) {
  if (k <= 0 || k >= logits.size(-1)) return logits;
  const at::Tensor kth = std::get<0>(logits.topk(k, -1)).narrow(-1, k - 1, 1);
  return logits.masked_fill(logits < kth, -INFINITY);
}

at::Tensor apply_top_p(const at::Tensor& logits, double p) {
  if (p >= 1.0) return logits;
  const auto [sorted, order] = logits.sort(-1, /*descending=*/false);
  const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
  at::Tensor remove = cumulative <= (1.0 - p);
  remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);  // the most likely token stays
  return logits.masked_fill(remove.scatter(-1, order, remove), -INFINITY);
}

at::Tensor process_logits(const at::Tensor& logits, const at::Tensor& seen, const SamplingOptions& o) {
  at::Tensor x = apply_repetition_penalty(logits.to(at::kFloat), seen, o.repetition_penalty);
  if (o.greedy()) return x;
  if (o.temperature != 1.0) x = x / o.temperature;
  return apply_top_p(apply_top_k(x, o.top_k), o.top_p);
}

at::Tensor next_tokens(const at::Tensor& logits, const at::Tensor& seen, const SamplingOptions& o, at::Generator& generator) {
  const at::Tensor x = process_logits(logits, seen, o);
  if (o.greedy()) return x.argmax(-1);
  // The draw on the host, with the one generator: the same tokens for a seed on any device.
  return at::multinomial(x.softmax(-1).cpu(), 1, false, generator).squeeze(1).to(logits.device());
}

}  // namespace dstrain::model
