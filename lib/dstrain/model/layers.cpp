#include "dstrain/model/layers.h"

#include <ATen/ATen.h>

namespace dstrain::model {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor wide = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean({-1}, true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

at::Tensor swiglu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down) {
  return at::linear(at::silu(at::linear(x, gate)) * at::linear(x, up), down);
}

Rope::Rope(int64_t dim, int64_t max_len, double theta, c10::ScalarType dtype) {
  // inv_freq[i] = theta^(-2i/dim); cos/sin = cat(freqs, freqs)
  const at::Tensor inv_freq = at::pow(theta, at::arange(0, dim, 2, at::kDouble) / static_cast<double>(dim)).reciprocal();
  const at::Tensor freqs = at::outer(at::arange(max_len, at::kDouble), inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  cos = emb.cos().to(dtype);
  sin = emb.sin().to(dtype);
}

void Rope::move_to(const c10::Device& device) {
  cos = cos.to(device);
  sin = sin.to(device);
}

at::Tensor Rope::apply(const at::Tensor& x) const {
  const int64_t T = x.size(-2), half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.narrow(0, 0, T) + rotated * sin.narrow(0, 0, T);
}

}  // namespace dstrain::model
