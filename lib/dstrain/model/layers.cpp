#include "dstrain/model/layers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "dstrain/model/fused_layers.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {

at::Tensor meta_tensor(const std::vector<int64_t>& shape) {
  return at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.is_cuda() && x.scalar_type() == weight.scalar_type()) return std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, weight, eps));
  return rms_norm_composite(x, weight, eps);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool recompute_in_backward) {
  if (!recompute_in_backward) return rms_norm(x, weight, eps);
  return recompute([weight, eps](const at::Tensor& t) { return rms_norm(t, weight, eps); }, x);
}

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // x enters the graph once (through a view when it is already wide): its gradient is then the
  // same sum whether or not the norm is recomputed (selective checkpointing, bit-identical).
  const bool is_wide = x.scalar_type() == at::kDouble || x.scalar_type() == at::kFloat;
  const at::Tensor wide = is_wide ? at::alias(x) : x.to(at::kFloat);
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean({-1}, true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

at::Tensor swiglu(const at::Tensor& x, const Projection& gate, const Projection& up, const Projection& down, bool recompute_activation) {
  const at::Tensor g = gate(x), u = up(x);
  if (!recompute_activation) return down(silu_mul(g, u));
  const Region activation = [](const std::vector<at::Tensor>& in, bool) { return std::vector<at::Tensor>{silu_mul(in[0], in[1])}; };
  return down(recompute(activation, {g, u}).at(0));
}

at::Tensor swiglu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down, bool recompute_activation) {
  return swiglu(
      x, [&](const at::Tensor& t) { return at::linear(t, gate); }, [&](const at::Tensor& t) { return at::linear(t, up); },
      [&](const at::Tensor& t) { return at::linear(t, down); }, recompute_activation);
}

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double deepseek_softmax_mscale(const config::ModelConfig& c) {
  if (c.rope_scaling == config::RopeScaling::kNone || c.rope_mscale_all_dim == 0) return 1.0;
  const double m = yarn_get_mscale(c.rope_factor, c.rope_mscale_all_dim);
  return m * m;
}

namespace {

// inv_freq[i] = theta^(-2i/dim), i < dim/2
at::Tensor plain_inv_freq(int64_t dim, double theta) {
  return at::pow(theta, at::arange(0, dim, 2, at::kDouble) / static_cast<double>(dim)).reciprocal();
}

// YaRN's frequencies (transformers' _compute_yarn_parameters, truncate = true).
at::Tensor yarn_inv_freq(int64_t dim, double theta, const config::ModelConfig& c) {
  const double original = static_cast<double>(c.rope_original_max_position > 0 ? c.rope_original_max_position : c.max_seq_len);
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  const double low = std::max(std::floor(correction_dim(c.rope_beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.rope_beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no singularity
  const at::Tensor extrapolation = plain_inv_freq(dim, theta), interpolation = extrapolation / c.rope_factor;
  const at::Tensor ramp = ((at::arange(dim / 2, at::kDouble) - low) / (high - low)).clamp(0, 1);
  const at::Tensor keep = 1 - ramp;  // 1: extrapolate (high frequencies), 0: interpolate
  return interpolation * (1 - keep) + extrapolation * keep;
}

double yarn_attention_factor(const config::ModelConfig& c) {
  if (c.rope_attention_factor > 0) return c.rope_attention_factor;
  if (c.rope_mscale > 0 && c.rope_mscale_all_dim > 0)
    return yarn_get_mscale(c.rope_factor, c.rope_mscale) / yarn_get_mscale(c.rope_factor, c.rope_mscale_all_dim);
  return yarn_get_mscale(c.rope_factor, 1.0);
}

void make_tables(const at::Tensor& inv_freq, int64_t max_len, double scale, c10::ScalarType dtype, at::Tensor& cos, at::Tensor& sin) {
  const at::Tensor freqs = at::outer(at::arange(max_len, at::kDouble), inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  cos = (emb.cos() * scale).to(dtype);
  sin = (emb.sin() * scale).to(dtype);
}

}  // namespace

Rope::Rope(int64_t dim, int64_t max_len, double theta, c10::ScalarType dtype) {
  make_tables(plain_inv_freq(dim, theta), max_len, 1.0, dtype, cos, sin);
}

Rope::Rope(int64_t dim, const config::ModelConfig& c, c10::ScalarType dtype) {
  switch (c.rope_scaling) {
    case config::RopeScaling::kLinear:
      make_tables(plain_inv_freq(dim, c.rope_theta) / c.rope_factor, c.max_seq_len, 1.0, dtype, cos, sin);
      break;
    case config::RopeScaling::kYarn:
      make_tables(yarn_inv_freq(dim, c.rope_theta, c), c.max_seq_len, yarn_attention_factor(c), dtype, cos, sin);
      break;
    case config::RopeScaling::kNone:
      make_tables(plain_inv_freq(dim, c.rope_theta), c.max_seq_len, 1.0, dtype, cos, sin);
      break;
  }
}

void Rope::move_to(const c10::Device& device) {
  cos = cos.to(device);
  sin = sin.to(device);
}

at::Tensor Rope::apply(const at::Tensor& x, const at::Tensor& positions) const {
  if (!positions.defined()) return rope(x, cos, sin);
  // Each token's own rows of the tables (packed documents restart their positions).
  const int64_t B = positions.size(0), T = positions.size(1), dim = cos.size(1), half = x.size(-1) / 2;
  const at::Tensor rows = positions.reshape({-1});
  const at::Tensor c = cos.index_select(0, rows).view({B, 1, T, dim}), s = sin.index_select(0, rows).view({B, 1, T, dim});
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

}  // namespace dstrain::model
