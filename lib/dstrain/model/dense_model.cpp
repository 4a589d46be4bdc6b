#include "dstrain/model/dense_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "dstrain/model/layers.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {

struct DenseModel::Impl {
  config::ModelConfig cfg;
  NamedTensors params;
  std::vector<size_t> group_first;  // by layer group: its first parameter's index in params (held groups only)
  Rope rope;                        // [max_seq_len, head_dim] tables

  const at::Tensor& p(size_t i) const { return params[i].tensor; }
};

DenseModel::DenseModel(const config::ModelConfig& cfg, uint64_t seed, c10::ScalarType dtype, Init init, const HeldGroups& held)
    : impl_(std::make_unique<Impl>()) {
  impl_->cfg = cfg;
  hold_groups(held, static_cast<int>(cfg.num_layers) + 1);
  impl_->group_first.assign(static_cast<size_t>(cfg.num_layers) + 2, 0);
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t kv_dim = (cfg.num_kv_heads > 0 ? cfg.num_kv_heads : cfg.num_heads) * (H / cfg.num_heads);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // N(0, init_std) for matrices; residual projections (o_proj, down_proj) N(0, init_std/sqrt(2L))
  // so that the residual stream's variance does not grow with depth; norms start at 1.
  const bool meta = init == Init::kShapesOnly;
  auto normal = [&](std::vector<int64_t> shape) { return meta ? meta_tensor(shape) : at::normal(0.0, cfg.init_std, shape, gen); };
  const double residual_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  auto residual = [&](std::vector<int64_t> shape) { return meta ? meta_tensor(shape) : at::normal(0.0, residual_std, shape, gen); };
  auto ones = [&](std::vector<int64_t> shape) { return meta ? meta_tensor(shape) : at::ones(shape); };
  int group = 0;                                    // the embeddings, then each decoder layer, then the final norm and head
  auto add = [&](std::string name, at::Tensor t) {  // drawn in any case: the same stream as the whole model's
    if (!holds_group(group)) return;
    if (impl_->params.empty() || parameter_places().back().group != group)
      impl_->group_first[static_cast<size_t>(group)] = impl_->params.size();
    declare_place({group, -1, t.dim() >= 2});
    impl_->params.push_back({std::move(name), t.to(dtype).set_requires_grad(true)});
  };

  add("model.embed_tokens.weight", normal({V, H}));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}.", i);
    group = static_cast<int>(i) + 1;
    add(prefix + "input_layernorm.weight", ones({H}));
    add(prefix + "self_attn.q_proj.weight", normal({H, H}));
    add(prefix + "self_attn.k_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.v_proj.weight", normal({kv_dim, H}));
    add(prefix + "self_attn.o_proj.weight", residual({H, H}));
    add(prefix + "post_attention_layernorm.weight", ones({H}));
    add(prefix + "mlp.gate_proj.weight", normal({I, H}));
    add(prefix + "mlp.up_proj.weight", normal({I, H}));
    add(prefix + "mlp.down_proj.weight", residual({H, I}));
  }
  group = static_cast<int>(cfg.num_layers) + 1;
  add("model.norm.weight", ones({H}));
  add("lm_head.weight", normal({V, H}));

  if (!meta) impl_->rope = Rope(H / cfg.num_heads, cfg, dtype);
}

DenseModel::~DenseModel() = default;

const NamedTensors& DenseModel::parameters() const { return impl_->params; }

void DenseModel::move_buffers_to(const c10::Device& device) { impl_->rope.move_to(device); }

namespace {

// One decoder layer of the dense model. Everything it reads is held by value (or through the
// model's Impl, which outlives the step): a recomputed layer runs again in backward, after
// trunk() has returned.
struct DenseLayer {
  const DenseModel::Impl* m;
  size_t b;  // the layer's first parameter (DenseModel::Impl::group_first)
  int64_t B, T, H, nh, nkv, d;
  double eps;
  at::Tensor attention_mask;
  at::Tensor positions;
  bool selective;

  at::Tensor operator()(const at::Tensor& x) const {
    const at::Tensor h = norm(x, m->p(b));
    const at::Tensor q = at::linear(h, m->p(b + 1)), k = at::linear(h, m->p(b + 2)), v = at::linear(h, m->p(b + 3));
    const at::Tensor attn = selective
                                ? recompute([self = *this](const std::vector<at::Tensor>& in,
                                                           bool) { return std::vector<at::Tensor>{self.attend(in[0], in[1], in[2])}; },
                                            {q, k, v})
                                      .at(0)
                                : attend(q, k, v);
    const at::Tensor x1 = x + at::linear(attn, m->p(b + 4));
    return x1 + swiglu(norm(x1, m->p(b + 5)), m->p(b + 6), m->p(b + 7), m->p(b + 8), selective);
  }

  at::Tensor norm(const at::Tensor& x, const at::Tensor& w) const { return rms_norm(x, w, eps, selective); }

  // The attention core from the q/k/v projections: heads, RoPE, GQA's repeat (after RoPE: the
  // same values on nkv heads only, in the layout the fused kernel takes), SDPA, back to [B, T, H].
  at::Tensor attend(const at::Tensor& q_lin, const at::Tensor& k_lin, const at::Tensor& v_lin) const {
    auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({B, T, n, d}).transpose(1, 2); };
    auto repeat_kv = [&](const at::Tensor& t) { return nkv == nh ? t : t.repeat_interleave(nh / nkv, 1); };
    const at::Tensor q = m->rope.apply(heads(q_lin, nh), positions);
    const at::Tensor k = repeat_kv(m->rope.apply(heads(k_lin, nkv), positions));
    const at::Tensor v = repeat_kv(heads(v_lin, nkv));
    const at::Tensor o = attention_mask.defined() ? at::scaled_dot_product_attention(q, k, v, attention_mask, 0.0, /*is_causal=*/false)
                                                  : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    return o.transpose(1, 2).reshape({B, T, H});
  }
};

}  // namespace

CausalLM::Trunk DenseModel::trunk(int first, int last, const at::Tensor& x_in, const Input& input, at::Tensor* aux) const {
  if (aux) *aux = at::Tensor();
  const at::Tensor &inputs = input.tokens, &positions = input.positions, &attention_mask = input.attention_mask;
  const Impl& m = *impl_;
  const auto& cfg = m.cfg;
  const at::Tensor& shaped = x_in.defined() ? x_in : inputs;
  const int64_t B = shaped.size(0), T = shaped.size(1), H = cfg.hidden_size, nh = cfg.num_heads, d = H / nh;
  const int64_t nkv = cfg.num_kv_heads > 0 ? cfg.num_kv_heads : nh;
  const int final_group = static_cast<int>(cfg.num_layers) + 1;
  auto first_param = [&](int group) {
    check_held(group);
    return m.group_first[static_cast<size_t>(group)];
  };
  at::Tensor x = x_in;
  if (first == 0) {
    enter_group(0);
    x = leave_group(0, at::embedding(m.p(first_param(0)), inputs));
  }
  for (int group = std::max(first, 1); group <= std::min(last, final_group - 1); ++group) {
    enter_group(group);
    const DenseLayer body{&m,
                          first_param(group),
                          B,
                          T,
                          H,
                          nh,
                          nkv,
                          d,
                          cfg.rms_norm_eps,
                          attention_mask,
                          positions,
                          recompute_mode_ == config::Recompute::kSelective};
    x = leave_group(group, recompute_mode_ == config::Recompute::kFull ? recompute(body, x) : body(x));
  }
  if (last < final_group) return {x, {}, last};
  const size_t at_final = first_param(final_group);
  enter_group(final_group);
  return {rms_norm(x, m.p(at_final), cfg.rms_norm_eps), m.p(at_final + 1), final_group};
}

}  // namespace dstrain::model
