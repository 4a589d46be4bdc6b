#include "dstrain/model/dense_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace dstrain::model {

struct DenseModel::Impl {
  config::ModelConfig cfg;
  NamedTensors params;
  at::Tensor cos, sin;  // [max_seq_len, head_dim]

  const at::Tensor& p(size_t i) const { return params[i].tensor; }
};

namespace {

constexpr size_t kPerLayer = 9;  // tensors per decoder layer, in the order added below

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean({-1}, true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

DenseModel::DenseModel(const config::ModelConfig& cfg, uint64_t seed) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t kv_dim = (cfg.num_kv_heads > 0 ? cfg.num_kv_heads : cfg.num_heads) * (H / cfg.num_heads);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, cfg.init_std, shape, gen); };
  auto add = [&](std::string name, at::Tensor t) { impl_->params.push_back({std::move(name), t.set_requires_grad(true)}); };

  add("model.embed_tokens.weight", normal({V, H}));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}.", i);
    add(prefix + "input_layernorm.weight", at::ones({H}));
    add(prefix + "self_attn.q_proj.weight", normal({H, H}));
    add(prefix + "self_attn.k_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.v_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.o_proj.weight", normal({H, H}));
    add(prefix + "post_attention_layernorm.weight", at::ones({H}));
    add(prefix + "mlp.gate_proj.weight", normal({I, H}));
    add(prefix + "mlp.up_proj.weight", normal({I, H}));
    add(prefix + "mlp.down_proj.weight", normal({H, I}));
  }
  add("model.norm.weight", at::ones({H}));
  add("lm_head.weight", normal({V, H}));

  // RoPE tables, half-split layout: inv_freq[i] = theta^(-2i/d), cos/sin = cat(freqs, freqs).
  const int64_t d = H / cfg.num_heads;
  const at::Tensor inv_freq = at::pow(cfg.rope_theta, at::arange(0, d, 2, at::kDouble) / static_cast<double>(d)).reciprocal();
  const at::Tensor freqs = at::outer(at::arange(cfg.max_seq_len, at::kDouble), inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  impl_->cos = emb.cos().to(at::kFloat);
  impl_->sin = emb.sin().to(at::kFloat);
}

DenseModel::~DenseModel() = default;

const NamedTensors& DenseModel::parameters() const { return impl_->params; }

int64_t DenseModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.tensor.numel();
  return n;
}

at::Tensor DenseModel::loss(const at::Tensor& inputs, const at::Tensor& targets) const {
  const at::Tensor out = logits(inputs);
  return at::cross_entropy_loss(out.reshape({-1, impl_->cfg.vocab_size}), targets.reshape({-1}));
}

at::Tensor DenseModel::logits(const at::Tensor& inputs) const {
  const Impl& m = *impl_;
  const auto& cfg = m.cfg;
  const int64_t B = inputs.size(0), T = inputs.size(1), H = cfg.hidden_size, nh = cfg.num_heads, d = H / nh;
  const int64_t nkv = cfg.num_kv_heads > 0 ? cfg.num_kv_heads : nh;
  const at::Tensor cos = m.cos.narrow(0, 0, T), sin = m.sin.narrow(0, 0, T);
  auto heads = [&](const at::Tensor& x) { return x.view({B, T, nh, d}).transpose(1, 2); };
  // Grouped KV heads: each of the nkv heads serves nh/nkv query heads.
  auto kv_heads = [&](const at::Tensor& x) {
    const at::Tensor h = x.view({B, T, nkv, d}).transpose(1, 2);
    return nkv == nh ? h : h.repeat_interleave(nh / nkv, 1);
  };
  auto rope = [&](const at::Tensor& x) { return x * cos + rotate_half(x) * sin; };

  at::Tensor x = at::embedding(m.p(0), inputs);
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    const size_t b = 1 + static_cast<size_t>(layer) * kPerLayer;
    const at::Tensor h = rms_norm(x, m.p(b), cfg.rms_norm_eps);
    const at::Tensor q = rope(heads(at::linear(h, m.p(b + 1))));
    const at::Tensor k = rope(kv_heads(at::linear(h, m.p(b + 2))));
    const at::Tensor v = kv_heads(at::linear(h, m.p(b + 3)));
    const at::Tensor attn = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    x = x + at::linear(attn.transpose(1, 2).reshape({B, T, H}), m.p(b + 4));
    const at::Tensor h2 = rms_norm(x, m.p(b + 5), cfg.rms_norm_eps);
    x = x + at::linear(at::silu(at::linear(h2, m.p(b + 6))) * at::linear(h2, m.p(b + 7)), m.p(b + 8));
  }
  const size_t last = 1 + static_cast<size_t>(cfg.num_layers) * kPerLayer;
  return at::linear(rms_norm(x, m.p(last), cfg.rms_norm_eps), m.p(last + 1));
}

}  // namespace dstrain::model
