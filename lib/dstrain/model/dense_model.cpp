#include "dstrain/model/dense_model.h"
#include "dstrain/model/layers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace dstrain::model {

struct DenseModel::Impl {
  config::ModelConfig cfg;
  NamedTensors params;
  Rope rope;  // [max_seq_len, head_dim] tables

  const at::Tensor& p(size_t i) const { return params[i].tensor; }
};

namespace {

constexpr size_t kPerLayer = 9;  // tensors per decoder layer, in the order added below

}  // namespace

DenseModel::DenseModel(const config::ModelConfig& cfg, uint64_t seed, c10::ScalarType dtype) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t kv_dim = (cfg.num_kv_heads > 0 ? cfg.num_kv_heads : cfg.num_heads) * (H / cfg.num_heads);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // N(0, init_std) for matrices; residual projections (o_proj, down_proj) N(0, init_std/sqrt(2L))
  // so that the residual stream's variance does not grow with depth; norms start at 1.
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, cfg.init_std, shape, gen); };
  const double residual_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  auto residual = [&](std::vector<int64_t> shape) { return at::normal(0.0, residual_std, shape, gen); };
  auto add = [&](std::string name, at::Tensor t) { impl_->params.push_back({std::move(name), t.to(dtype).set_requires_grad(true)}); };

  add("model.embed_tokens.weight", normal({V, H}));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}.", i);
    add(prefix + "input_layernorm.weight", at::ones({H}));
    add(prefix + "self_attn.q_proj.weight", normal({H, H}));
    add(prefix + "self_attn.k_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.v_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.o_proj.weight", residual({H, H}));
    add(prefix + "post_attention_layernorm.weight", at::ones({H}));
    add(prefix + "mlp.gate_proj.weight", normal({I, H}));
    add(prefix + "mlp.up_proj.weight", normal({I, H}));
    add(prefix + "mlp.down_proj.weight", residual({H, I}));
  }
  add("model.norm.weight", at::ones({H}));
  add("lm_head.weight", normal({V, H}));

  impl_->rope = Rope(H / cfg.num_heads, cfg, dtype);
}

DenseModel::~DenseModel() = default;

const NamedTensors& DenseModel::parameters() const { return impl_->params; }

void DenseModel::move_buffers_to(const c10::Device& device) { impl_->rope.move_to(device); }

CausalLM::Trunk DenseModel::trunk(const at::Tensor& inputs, at::Tensor* aux, const at::Tensor& attention_mask) const {
  if (aux) *aux = at::Tensor();
  const Impl& m = *impl_;
  const auto& cfg = m.cfg;
  const int64_t B = inputs.size(0), T = inputs.size(1), H = cfg.hidden_size, nh = cfg.num_heads, d = H / nh;
  const int64_t nkv = cfg.num_kv_heads > 0 ? cfg.num_kv_heads : nh;
  auto heads = [&](const at::Tensor& x) { return x.view({B, T, nh, d}).transpose(1, 2); };
  // Grouped KV heads: each of the nkv heads serves nh/nkv query heads (RoPE before the repeat:
  // the same values, on nkv heads only, in the layout the fused kernel takes).
  auto kv_view = [&](const at::Tensor& x) { return x.view({B, T, nkv, d}).transpose(1, 2); };
  auto repeat_kv = [&](const at::Tensor& h) { return nkv == nh ? h : h.repeat_interleave(nh / nkv, 1); };
  auto rope = [&](const at::Tensor& x) { return m.rope.apply(x); };

  enter_group(0);
  at::Tensor x = leave_group(0, at::embedding(m.p(0), inputs));
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    const int group = static_cast<int>(layer) + 1;
    enter_group(group);
    const size_t b = 1 + static_cast<size_t>(layer) * kPerLayer;
    const at::Tensor h = rms_norm(x, m.p(b), cfg.rms_norm_eps);
    const at::Tensor q = rope(heads(at::linear(h, m.p(b + 1))));
    const at::Tensor k = repeat_kv(rope(kv_view(at::linear(h, m.p(b + 2)))));
    const at::Tensor v = repeat_kv(kv_view(at::linear(h, m.p(b + 3))));
    const at::Tensor attn = attention_mask.defined() ? at::scaled_dot_product_attention(q, k, v, attention_mask, 0.0, /*is_causal=*/false)
                                                     : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    x = x + at::linear(attn.transpose(1, 2).reshape({B, T, H}), m.p(b + 4));
    const at::Tensor h2 = rms_norm(x, m.p(b + 5), cfg.rms_norm_eps);
    x = leave_group(group, x + swiglu(h2, m.p(b + 6), m.p(b + 7), m.p(b + 8)));
  }
  const size_t last = 1 + static_cast<size_t>(cfg.num_layers) * kPerLayer;
  const int final_group = static_cast<int>(cfg.num_layers) + 1;
  enter_group(final_group);
  return {rms_norm(x, m.p(last), cfg.rms_norm_eps), m.p(last + 1), final_group};
}

}  // namespace dstrain::model
