#include "dstrain/model/dense_model.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "dstrain/model/kv_cache.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/mlp.h"
#include "dstrain/model/param_builder.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {

// One decoder layer's parts (null/undefined in a layer another pipeline stage holds).
struct DenseLayerParts {
  at::Tensor input_norm, post_attention_norm;
  const Linear *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  Mlp mlp;
};

struct DenseModel::Impl {
  config::ModelConfig cfg;
  at::Tensor embed, final_norm, head;
  std::vector<DenseLayerParts> layers;
  Rope rope;  // [max_seq_len, head_dim] tables
};

DenseModel::DenseModel(const config::ModelConfig& cfg, uint64_t seed, c10::ScalarType dtype, Init init, const HeldGroups& held)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = cfg;
  hold_groups(held, static_cast<int>(cfg.num_layers) + 1);
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t kv_dim = (cfg.num_kv_heads > 0 ? cfg.num_kv_heads : cfg.num_heads) * (H / cfg.num_heads);
  ParamBuilder b(*this, seed, dtype, init);
  // N(0, init_std) for matrices; residual projections (o_proj, down_proj) N(0, init_std/sqrt(2L))
  // so that the residual stream's variance does not grow with depth; norms start at 1.
  const double std = cfg.init_std, residual_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  m.embed = b.add("model.embed_tokens.weight", ParamRole::kEmbedding, b.normal({V, H}, std));
  m.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    DenseLayerParts& layer = m.layers[static_cast<size_t>(i)];
    b.set_group(static_cast<int>(i) + 1);
    layer.input_norm = b.add_norm(l + "input_layernorm.weight", H);
    layer.q = b.add_linear(l + "self_attn.q_proj", ParamRole::kAttention, b.normal({H, H}, std));
    layer.k = b.add_linear(l + "self_attn.k_proj", ParamRole::kAttention, b.normal({kv_dim, H}, std));
    layer.v = b.add_linear(l + "self_attn.v_proj", ParamRole::kAttention, b.normal({kv_dim, H}, std));
    layer.o = b.add_linear(l + "self_attn.o_proj", ParamRole::kAttention, b.normal({H, H}, residual_std));
    layer.post_attention_norm = b.add_norm(l + "post_attention_layernorm.weight", H);
    layer.mlp = add_mlp(b, l + "mlp.", ParamRole::kMlp, I, H, std, residual_std);
  }
  b.set_group(static_cast<int>(cfg.num_layers) + 1);
  m.final_norm = b.add_norm("model.norm.weight", H);
  m.head = cfg.score_head ? b.add("score.weight", ParamRole::kHead, b.normal({1, H}, std))  // a reward model's one score
                          : b.add("lm_head.weight", ParamRole::kHead, b.normal({V, H}, std));
  if (init != Init::kShapesOnly) m.rope = Rope(H / cfg.num_heads, cfg, dtype);
}

DenseModel::~DenseModel() = default;

void DenseModel::move_buffers_to(const c10::Device& device) { impl_->rope.move_to(device); }

namespace {

// One decoder layer of the dense model. Everything it reads is held by value (or through the
// model's Impl, which outlives the step): a recomputed layer runs again in backward, after
// trunk() has returned.
struct DenseLayer {
  const DenseModel::Impl* m;
  const DenseLayerParts* parts;
  int64_t B, T, H, nh, nkv, d;
  double eps;
  AttentionScope scope;
  bool selective;
  KvCache* cache;  // generation: this layer's keys and values go there (nullptr otherwise)
  int64_t layer;

  at::Tensor operator()(const at::Tensor& x) const {
    const DenseLayerParts& p = *parts;
    const at::Tensor h = norm(x, p.input_norm);
    const at::Tensor q = apply(*p.q, h), k = apply(*p.k, h), v = apply(*p.v, h);
    const at::Tensor attn = selective
                                ? recompute([self = *this](const std::vector<at::Tensor>& in,
                                                           bool) { return std::vector<at::Tensor>{self.attention(in[0], in[1], in[2])}; },
                                            {q, k, v})
                                      .at(0)
                                : attention(q, k, v);
    const at::Tensor x1 = x + apply(*p.o, attn);
    return x1 + swiglu(norm(x1, p.post_attention_norm), p.mlp, selective);
  }

  at::Tensor norm(const at::Tensor& x, const at::Tensor& w) const { return rms_norm(x, w, eps, selective); }

  // The attention core from the q/k/v projections: heads, RoPE, GQA's repeat (after RoPE: the
  // same values on nkv heads only, in the layout the fused kernel takes), attend, back to [B, T, H].
  at::Tensor attention(const at::Tensor& q_lin, const at::Tensor& k_lin, const at::Tensor& v_lin) const {
    auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({B, T, n, d}).transpose(1, 2); };
    auto repeat_kv = [&](const at::Tensor& t) { return nkv == nh ? t : t.repeat_interleave(nh / nkv, 1); };
    const at::Tensor q = m->rope.apply(heads(q_lin, nh), scope.positions);
    at::Tensor k = m->rope.apply(heads(k_lin, nkv), scope.positions), v = heads(v_lin, nkv);
    if (cache) k = cache->store_keys(layer, k, 2), v = cache->store_values(layer, v, 2);
    return attend(q, repeat_kv(k), repeat_kv(v), scope).transpose(1, 2).reshape({B, T, H});
  }
};

}  // namespace

CausalLM::Trunk DenseModel::trunk(int first, int last, const at::Tensor& x_in, const Input& input, at::Tensor* aux) const {
  if (aux) *aux = at::Tensor();
  const Impl& m = *impl_;
  const auto& cfg = m.cfg;
  const at::Tensor& shaped = x_in.defined() ? x_in : input.tokens;
  const int64_t B = shaped.size(0), T = shaped.size(1), H = cfg.hidden_size, nh = cfg.num_heads, d = H / nh;
  const int64_t nkv = cfg.num_kv_heads > 0 ? cfg.num_kv_heads : nh;
  const int final_group = static_cast<int>(cfg.num_layers) + 1;
  const AttentionScope scope = input.scope();
  at::Tensor x = x_in;
  if (first == 0) {
    check_held(0);
    enter_group(0);
    x = leave_group(0, at::embedding(m.embed, input.tokens));
  }
  for (int group = std::max(first, 1); group <= std::min(last, final_group - 1); ++group) {
    check_held(group);
    enter_group(group);
    const DenseLayer body{&m,    &m.layers[static_cast<size_t>(group - 1)],        B,           T,        H, nh, nkv, d, cfg.rms_norm_eps,
                          scope, recompute_mode_ == config::Recompute::kSelective, input.cache, group - 1};
    x = leave_group(group, recompute_mode_ == config::Recompute::kFull ? recompute(body, x) : body(x));
  }
  if (last < final_group) return {x, {}, last};
  check_held(final_group);
  enter_group(final_group);
  return {rms_norm(x, m.final_norm, cfg.rms_norm_eps), m.head, final_group};
}

}  // namespace dstrain::model
