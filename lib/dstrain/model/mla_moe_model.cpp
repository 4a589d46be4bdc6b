#include "dstrain/model/mla_moe_model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <atomic>
#include <optional>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/model/kv_cache.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/mlp.h"
#include "dstrain/model/moe_experts.h"
#include "dstrain/model/param_builder.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {

// One decoder layer's parts, the main model's or an MTP module's (null/undefined in a layer
// another pipeline stage holds).
struct MlaLayerParts {
  at::Tensor input_norm, post_attention_norm, q_a_norm, kv_a_norm;
  const Linear *q = nullptr, *q_a = nullptr, *q_b = nullptr, *kv_a = nullptr, *kv_b = nullptr, *o = nullptr;
  Mlp mlp;  // a dense layer's MLP
  // An MoE layer's router, V3's selection bias (a buffer), this rank's routed experts and the shared experts.
  const Linear* router = nullptr;
  at::Tensor selection_bias;
  LocalExperts experts;
  Mlp shared;
  // An MTP module's own parts around its decoder block.
  at::Tensor enorm, hnorm, shared_head_norm;
  const Linear* eh_proj = nullptr;
};

struct MlaMoeModel::Impl {
  config::ModelConfig cfg;
  NamedTensors buffers;
  at::Tensor embed, final_norm, head;
  std::vector<MlaLayerParts> layers;                 // by HF layer index: the decoder layers, then the MTP modules
  Rope rope;                                         // over qk_rope_head_dim
  at::Tensor load;                                   // [moe layers, N_r] tokens routed since take_expert_load (float64 counts)
  std::vector<int64_t> moe_layers;                   // every MoE layer of the model (the load's rows), held or not
  comm::Communicator* expert_group = nullptr;        // expert parallelism: the ranks the routed experts are spread over
  int64_t first_expert = 0, local_experts = 0;       // the routed experts this rank holds: [first, first + local)
  mutable std::atomic<int64_t> exchange_wait_ns{0};  // blocked on the expert all-to-alls since take_all_to_all_wait_ms
};

namespace {

// A decoder layer's attention parts, in the released order.
void add_attention(ParamBuilder& b, const config::ModelConfig& c, const std::string& l, double residual_std, MlaLayerParts& p) {
  const int64_t H = c.hidden_size, nh = c.num_heads, dqk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  p.input_norm = b.add_norm(l + "input_layernorm.weight", H);
  if (c.q_lora_rank > 0) {
    p.q_a = b.add_linear(l + "self_attn.q_a_proj", ParamRole::kAttention, b.normal({c.q_lora_rank, H}, c.init_std));
    p.q_a_norm = b.add_norm(l + "self_attn.q_a_layernorm.weight", c.q_lora_rank);
    p.q_b = b.add_linear(l + "self_attn.q_b_proj", ParamRole::kAttention, b.normal({nh * dqk, c.q_lora_rank}, c.init_std));
  } else {
    p.q = b.add_linear(l + "self_attn.q_proj", ParamRole::kAttention, b.normal({nh * dqk, H}, c.init_std));
  }
  p.kv_a = b.add_linear(l + "self_attn.kv_a_proj_with_mqa", ParamRole::kAttention,
                        b.normal({c.kv_lora_rank + c.qk_rope_head_dim, H}, c.init_std));
  p.kv_a_norm = b.add_norm(l + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
  p.kv_b = b.add_linear(l + "self_attn.kv_b_proj", ParamRole::kAttention,
                        b.normal({nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, c.init_std));
  p.o = b.add_linear(l + "self_attn.o_proj", ParamRole::kAttention, b.normal({H, nh * c.v_head_dim}, residual_std));
}

// An MoE layer's router, routed experts (every expert drawn, this rank's block kept) and shared experts.
void add_moe(ParamBuilder& b, const config::ModelConfig& c, const std::string& l, double residual_std, int64_t first_expert,
             int64_t local_experts, MlaLayerParts& p) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  p.router = b.add_linear(l + "mlp.gate", ParamRole::kRouter, b.normal({c.n_routed_experts, H}, c.init_std));
  p.experts.first = first_expert;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const at::Tensor gate = b.normal({I, H}, c.init_std), up = b.normal({I, H}, c.init_std), down = b.normal({H, I}, residual_std);
    if (e < first_expert || e >= first_expert + local_experts) continue;
    const std::string x = fmt::format("{}mlp.experts.{}.", l, e);
    for (const auto& [proj, value, out] :
         {std::tuple<const char*, at::Tensor, std::vector<at::Tensor>*>{"gate_proj", gate, &p.experts.gate},
          {"up_proj", up, &p.experts.up},
          {"down_proj", down, &p.experts.down}}) {
      b.set_expert(e - first_expert, l + "mlp.experts.{}." + proj + ".weight");
      const at::Tensor w = b.add(x + proj + ".weight", ParamRole::kExpert, value);
      if (w.defined()) out->push_back(w);
    }
    b.end_expert();
  }
  if (c.n_shared_experts > 0)
    p.shared = add_mlp(b, l + "mlp.shared_experts.", ParamRole::kMlp, I * c.n_shared_experts, H, c.init_std, residual_std);
}

}  // namespace

MlaMoeModel::MlaMoeModel(const config::ModelConfig& c, uint64_t seed, c10::ScalarType dtype, comm::Communicator* expert_group, Init init,
                         const HeldGroups& held)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = c;
  hold_groups(held, static_cast<int>(c.num_layers) + 1);
  m.expert_group = expert_group;
  const int64_t ep = expert_group ? expert_group->world_size() : 1;
  if (c.n_routed_experts % ep != 0)
    throw Error(ErrorCode::kConfig, fmt::format("{} routed experts cannot be spread evenly over {} ranks", c.n_routed_experts, ep),
                "choose an expert-parallel size that divides model.n_routed_experts");
  m.local_experts = c.n_routed_experts / ep;
  m.first_expert = expert_group ? expert_group->rank() * m.local_experts : 0;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  ParamBuilder b(*this, seed, dtype, init);
  // Init: N(0, init_std) for matrices, ones for norms; residual projections (o_proj, down_proj)
  // scaled by 1/sqrt(2 * layers), as GPT-2 and Megatron do, so the residual stream's variance
  // does not grow with depth. Every rank draws every expert's initial weights (the same stream
  // as without expert parallelism, so the same model) and keeps its own.
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  m.embed = b.add("model.embed_tokens.weight", ParamRole::kEmbedding, b.normal({V, H}, c.init_std));
  m.layers.resize(static_cast<size_t>(c.num_layers + c.mtp_depth));
  // A decoder layer's parts (and V3's selection bias), the main model's or an MTP module's.
  auto add_decoder_layer = [&](int64_t i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    MlaLayerParts& p = m.layers[static_cast<size_t>(i)];
    add_attention(b, c, l, residual_std, p);
    p.post_attention_norm = b.add_norm(l + "post_attention_layernorm.weight", H);
    if (!c.is_moe_layer(i)) {
      p.mlp = add_mlp(b, l + "mlp.", ParamRole::kMlp, c.intermediate_size, H, c.init_std, residual_std);
      return;
    }
    m.moe_layers.push_back(i);
    add_moe(b, c, l, residual_std, m.first_expert, m.local_experts, p);
    if (c.topk_method == config::TopkMethod::kNoauxTc && b.holds_group()) {
      p.selection_bias = at::zeros({c.n_routed_experts}, at::kFloat);  // fp32, no gradient, no decay
      m.buffers.push_back({l + "mlp.gate.e_score_correction_bias", p.selection_bias});
    }
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    b.set_group(static_cast<int>(i) + 1);
    add_decoder_layer(i);
  }
  b.set_group(static_cast<int>(c.num_layers) + 1);
  m.final_norm = b.add_norm("model.norm.weight", H);
  m.head = c.score_head ? b.add("score.weight", ParamRole::kHead, b.normal({1, H}, c.init_std))  // a reward model's one score
                        : b.add("lm_head.weight", ParamRole::kHead, b.normal({V, H}, c.init_std));
  // Multi-token prediction: module k is HF's layer L + k - 1 (enorm, hnorm, eh_proj, a decoder
  // block, shared_head.norm), in the final group with the head it shares; drawn after the main
  // model, whose initial values MTP does not change.
  for (int64_t k = 1; k <= c.mtp_depth; ++k) {
    const int64_t i = c.num_layers + k - 1;
    const std::string l = fmt::format("model.layers.{}.", i);
    MlaLayerParts& p = m.layers[static_cast<size_t>(i)];
    p.enorm = b.add_norm(l + "enorm.weight", H);
    p.hnorm = b.add_norm(l + "hnorm.weight", H);
    p.eh_proj = b.add_linear(l + "eh_proj", ParamRole::kMtpProjection, b.normal({H, 2 * H}, c.init_std));
    add_decoder_layer(i);
    p.shared_head_norm = b.add_norm(l + "shared_head.norm.weight", H);
  }
  if (init != Init::kShapesOnly) m.rope = Rope(c.qk_rope_head_dim, c, dtype);
  m.load = at::zeros({static_cast<int64_t>(m.moe_layers.size()), c.n_routed_experts}, at::kDouble);
}

MlaMoeModel::~MlaMoeModel() = default;

const NamedTensors& MlaMoeModel::buffers() const { return impl_->buffers; }

void MlaMoeModel::move_buffers_to(const c10::Device& device) {
  impl_->rope.move_to(device);
  impl_->load = impl_->load.to(device);
  // set_data keeps every handle (buffers(), by_name, the checkpointer's list) pointing at it.
  for (auto& b : impl_->buffers) b.tensor.set_data(b.tensor.to(device));
}

double MlaMoeModel::take_all_to_all_wait_ms() {
  if (!impl_->expert_group) return CausalLM::take_all_to_all_wait_ms();
  return static_cast<double>(impl_->exchange_wait_ns.exchange(0)) / 1e6;
}

CausalLM::ExpertBlock MlaMoeModel::local_experts() const { return {impl_->first_expert, impl_->local_experts}; }

std::vector<CausalLM::ExpertLayer> MlaMoeModel::expert_layers() {
  std::vector<ExpertLayer> out;
  for (const int64_t layer : impl_->moe_layers) {
    MlaLayerParts& p = impl_->layers[static_cast<size_t>(layer)];
    if (p.experts.gate.empty()) continue;  // another pipeline stage's
    const int group = layer < impl_->cfg.num_layers ? static_cast<int>(layer) + 1 : final_group();
    out.push_back({fmt::format("model.layers.{}.mlp.experts.", layer), group, &p.experts});
  }
  return out;
}

at::Tensor MlaMoeModel::take_expert_load() {
  at::Tensor out = impl_->load.clone();
  impl_->load.zero_();
  return out;
}

void MlaMoeModel::update_expert_bias(const at::Tensor& global_load) {
  const auto& c = impl_->cfg;
  if (c.topk_method != config::TopkMethod::kNoauxTc || c.bias_update_speed == 0) return;
  c10::NoGradGuard no_grad;
  for (size_t k = 0; k < impl_->moe_layers.size(); ++k) {
    const int64_t layer = impl_->moe_layers[k];                                       // an MTP module's layer (>= L) is in the final group
    if (!holds_group(static_cast<int>(std::min(layer, c.num_layers)) + 1)) continue;  // another pipeline stage's layer
    const MlaLayerParts& parts = impl_->layers[static_cast<size_t>(layer)];
    if (!parameter_places()[parts.router->index].trains) continue;  // a frozen router's selection stays as it is
    const at::Tensor counts = global_load[static_cast<int64_t>(k)].to(impl_->load.device(), at::kFloat);
    // b_i += gamma * sign(mean - c_i): underloaded experts become more attractive.
    parts.selection_bias.add_(at::sign(counts.mean() - counts), c.bias_update_speed);
  }
}

namespace {

// MLA's attention core: RoPE, the per-head K and V, and attend() from the projections' outputs.
at::Tensor mla_core(const MlaMoeModel::Impl& m, const at::Tensor& q_flat, const at::Tensor& ckv, const at::Tensor& kv_lin,
                    const AttentionScope& scope) {
  const auto& c = m.cfg;
  const int64_t B = q_flat.size(0), T = q_flat.size(1), nh = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim;
  const at::Tensor q = q_flat.view({B, T, nh, dn + dr}).transpose(1, 2);  // [B, nh, T, dqk]
  const at::Tensor k_pe =
      m.rope.apply(ckv.narrow(-1, c.kv_lora_rank, dr).unsqueeze(1), scope.positions);  // one head, shared: [B, 1, T, dr]
  const at::Tensor kv = kv_lin.view({B, T, nh, dn + dv}).transpose(1, 2);
  const at::Tensor query = at::cat({q.narrow(-1, 0, dn), m.rope.apply(q.narrow(-1, dn, dr), scope.positions)}, -1);
  const at::Tensor key = at::cat({kv.narrow(-1, 0, dn), k_pe.expand({B, nh, T, dr})}, -1);
  const at::Tensor value = kv.narrow(-1, dn, dv);
  // (d_nope + d_rope)^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 under scaling (as HF does).
  const double scale = deepseek_softmax_mscale(c) / std::sqrt(static_cast<double>(dn + dr));
  return attend(query, key, value, scope, scale).transpose(1, 2).reshape({B, T, nh * dv});
}

// MLA in generation: the cache holds each token's normed latent and roped key (kv_lora_rank +
// qk_rope_head_dim numbers), not per-head K and V. With a plain kv_b (no adapter, no quantized
// base) its two halves are absorbed, as DeepSeek-V2/V3's inference does: the query's nope part is
// taken into the latent space (q W_kb), attention runs over the latents themselves, and W_vb maps
// the result to each head's value; otherwise kv_b is applied to the cached latents.
at::Tensor mla_cached(const MlaMoeModel::Impl& m, const MlaLayerParts& p, const at::Tensor& q_flat, const at::Tensor& ckv,
                      const AttentionScope& scope, KvCache& cache, int64_t layer) {
  const auto& c = m.cfg;
  const int64_t B = q_flat.size(0), T = q_flat.size(1), nh = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, r = c.kv_lora_rank;
  const at::Tensor latent = rms_norm(ckv.narrow(-1, 0, r), p.kv_a_norm, c.rms_norm_eps);
  const at::Tensor k_pe = m.rope.apply(ckv.narrow(-1, r, dr).unsqueeze(1), scope.positions).squeeze(1);  // [B, T, dr]
  const at::Tensor cached = cache.store_keys(layer, at::cat({latent, k_pe}, -1), 1);                     // [B, S, r + dr]
  const int64_t S = cached.size(1);
  const at::Tensor q = q_flat.view({B, T, nh, dn + dr}).transpose(1, 2);
  const at::Tensor q_nope = q.narrow(-1, 0, dn), q_pe = m.rope.apply(q.narrow(-1, dn, dr), scope.positions);
  const double scale = deepseek_softmax_mscale(c) / std::sqrt(static_cast<double>(dn + dr));
  const bool plain = !p.kv_b->base && (p.kv_b->adapters.empty() || !adapters_on());
  if (!plain) {  // per-head K and V from the cached latents
    const at::Tensor kv = apply(*p.kv_b, cached.narrow(-1, 0, r)).view({B, S, nh, dn + dv}).transpose(1, 2);
    const at::Tensor key = at::cat({kv.narrow(-1, 0, dn), cached.narrow(-1, r, dr).unsqueeze(1).expand({B, nh, S, dr})}, -1);
    return attend(at::cat({q_nope, q_pe}, -1), key, kv.narrow(-1, dn, dv), scope, scale).transpose(1, 2).reshape({B, T, nh * dv});
  }
  const at::Tensor w = p.kv_b->weight.view({nh, dn + dv, r});
  const at::Tensor query = at::cat({at::matmul(q_nope, w.narrow(1, 0, dn)), q_pe}, -1);  // [B, nh, T, r + dr]
  // Every head attends to the same latents: the heads fold into one of nh * T queries (rows
  // ordered head by head), so the cache is read once and never copied per head.
  AttentionScope folded = scope;
  folded.mask = scope.mask.expand({B, nh, T, S}).reshape({B, 1, nh * T, S});
  const at::Tensor key = cached.unsqueeze(1);  // [B, 1, S, r + dr]
  const at::Tensor out = attend(query.reshape({B, 1, nh * T, r + dr}), key, key.narrow(-1, 0, r), folded, scale).view({B, nh, T, r});
  return at::matmul(out, w.narrow(1, dn, dv).transpose(1, 2)).transpose(1, 2).reshape({B, T, nh * dv});
}

// MLA, the training form: per-head K and V are materialised from the compressed latent.
// `selective`: the norms and the attention core (RoPE, attend) are recomputed in backward from
// the projections' outputs, which are kept.
at::Tensor mla(const MlaMoeModel::Impl& m, const MlaLayerParts& p, const at::Tensor& h, const AttentionScope& scope, bool selective,
               KvCache* cache, int64_t layer) {
  const auto& c = m.cfg;
  const at::Tensor q_flat =
      c.q_lora_rank > 0 ? apply(*p.q_b, rms_norm(apply(*p.q_a, h), p.q_a_norm, c.rms_norm_eps, selective)) : apply(*p.q, h);
  const at::Tensor ckv = apply(*p.kv_a, h);  // [B, T, kvr + dr]
  if (cache) return apply(*p.o, mla_cached(m, p, q_flat, ckv, scope, *cache, layer));
  const at::Tensor kv_lin = apply(*p.kv_b, rms_norm(ckv.narrow(-1, 0, c.kv_lora_rank), p.kv_a_norm, c.rms_norm_eps, selective));
  const MlaMoeModel::Impl* mp = &m;
  const Region core = [mp, scope](const std::vector<at::Tensor>& in, bool) {
    return std::vector<at::Tensor>{mla_core(*mp, in[0], in[1], in[2], scope)};
  };
  const at::Tensor o = selective ? recompute(core, {q_flat, ckv, kv_lin}).at(0) : core({q_flat, ckv, kv_lin}, false).at(0);
  return apply(*p.o, o);
}

// The router's choice for each token: the K experts [N, K] and their weights [N, K], from the
// router's scores [N, N_r] (fp32 or wider).
struct Routing {
  at::Tensor scores, idx, weights;
};

Routing route(const config::ModelConfig& c, const MlaLayerParts& p, const at::Tensor& flat, at::ScalarType wide) {
  const int64_t N = flat.size(0), Nr = c.n_routed_experts, K = c.num_experts_per_tok;
  Routing r;
  const at::Tensor router_logits = apply(*p.router, flat, wide);  // in fp32 (or wider, for gradient checks)
  r.scores = c.scoring_func == config::ScoringFunc::kSigmoid ? at::sigmoid(router_logits) : at::softmax(router_logits, -1);
  at::Tensor choice = r.scores.detach();
  if (c.topk_method == config::TopkMethod::kNoauxTc) choice = choice + p.selection_bias.to(wide);
  if (c.topk_method != config::TopkMethod::kGreedy && c.n_group > 1) {
    const at::Tensor grouped = choice.view({N, c.n_group, Nr / c.n_group});
    const at::Tensor group_score = c.topk_method == config::TopkMethod::kNoauxTc
                                       ? std::get<0>(grouped.topk(std::min<int64_t>(2, Nr / c.n_group), -1)).sum(-1)
                                       : std::get<0>(grouped.max(-1));
    const at::Tensor keep_groups = std::get<1>(group_score.topk(c.topk_group, -1));
    const at::Tensor group_mask = at::zeros({N, c.n_group}, flat.options().dtype(at::kBool)).scatter_(1, keep_groups, true);
    choice = choice.masked_fill(~group_mask.unsqueeze(-1).expand({N, c.n_group, Nr / c.n_group}).reshape({N, Nr}), -INFINITY);
  }
  r.idx = std::get<1>(choice.topk(K, -1));  // [N, K]
  r.weights = r.scores.gather(1, r.idx);    // the unbiased scores
  if (c.norm_topk_prob) r.weights = r.weights / (r.weights.sum(-1, true) + 1e-20);
  if (!c.norm_topk_prob || c.scoring_func == config::ScoringFunc::kSigmoid) r.weights = r.weights * c.routed_scaling_factor;
  return r;
}

// Sequence parallelism's view of a layer's tokens: the group (null: none), which of this rank's T
// tokens the whole rows' forward has (bool [T]; an MTP depth k has T_whole - k of them), and how
// many the whole rows have.
struct SequenceTokens {
  comm::Communicator* group = nullptr;
  at::Tensor valid;  // undefined: all of them
  int64_t whole = 0;
};

// The main layers' view: every token of this rank's T.
SequenceTokens sequence_tokens(const AttentionScope& scope, int64_t T) {
  if (!scope.sequence || scope.sequence->world_size() == 1) return {};
  return {scope.sequence, {}, T * scope.sequence->world_size()};
}

// The sequence-wise balance loss of one MoE layer: alpha * mean_b sum_i f_{b,i} P_{b,i},
// f = N_r/(K T) * selections, P = mean over the sequence of the (normalised) scores. With sequence
// parallelism (`sequence`: x holds T / S of each row's tokens) the selections are summed over the
// group and P is this rank's part of the mean, so the group's losses add up to the whole rows'.
at::Tensor balance_loss(const config::ModelConfig& c, const Routing& r, int64_t B, int64_t T, at::ScalarType wide,
                        const SequenceTokens& sequence) {
  const int64_t Nr = c.n_routed_experts, K = c.num_experts_per_tok;
  const auto options = r.scores.options().dtype(wide);
  at::Tensor s = c.scoring_func == config::ScoringFunc::kSigmoid ? r.scores / r.scores.sum(-1, true) : r.scores;
  if (!sequence.group) {
    at::Tensor per_seq = at::zeros({B, Nr}, options).scatter_add_(1, r.idx.view({B, T * K}), at::ones({B, T * K}, options));
    const at::Tensor f = per_seq * (static_cast<double>(Nr) / static_cast<double>(K * T));
    return (f * s.view({B, T, Nr}).mean(1)).sum(-1).mean() * c.aux_loss_alpha;
  }
  // Only the tokens that the whole rows' forward has (an MTP depth's last rows are not): `valid`.
  const at::Tensor keep = sequence.valid.defined() ? sequence.valid.to(wide).view({1, T, 1}) : at::ones({1, T, 1}, options);
  at::Tensor counts = at::zeros({B, Nr}, options).scatter_add_(1, r.idx.view({B, T * K}), keep.expand({B, T, K}).reshape({B, T * K}));
  counts = counts.to(at::kFloat).contiguous();  // exact: counts below 2^24
  sequence.group->all_reduce(counts)->wait();
  const double whole = static_cast<double>(sequence.whole);
  const at::Tensor f = counts.to(wide) * (static_cast<double>(Nr) / (static_cast<double>(K) * whole));
  return (f * ((s.view({B, T, Nr}) * keep).sum(1) / whole)).sum(-1).mean() * c.aux_loss_alpha;
}

// DeepSeekMoE over x [B, T, H]. Adds this layer's balance loss to *aux and its expert load to
// `load_row` (when defined). `selective`: the experts' SwiGLU activations are recomputed in backward.
at::Tensor moe(const MlaMoeModel::Impl& m, const MlaLayerParts& p, const at::Tensor& x, at::Tensor* aux, at::Tensor load_row,
               bool selective, const SequenceTokens& sequence) {
  const auto& c = m.cfg;
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), N = B * T, Nr = c.n_routed_experts;
  const at::Tensor flat = x.reshape({N, H});
  const auto wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const Routing r = route(c, p, flat, wide);
  // The shared experts run while the routed tokens are dispatched to their experts' ranks.
  at::Tensor shared;
  auto shared_experts = [&] {
    if (c.n_shared_experts > 0) shared = swiglu(flat, p.shared, selective);
  };
  static const bool overlap = [] {  // DSTRAIN_EP_OVERLAP=0: after the exchange (for measuring what overlap hides)
    const char* v = std::getenv("DSTRAIN_EP_OVERLAP");
    return !(v && std::string(v) == "0");
  }();
  ExchangeHooks hooks;
  hooks.wait_ns = &m.exchange_wait_ns;
  if (m.expert_group && overlap) hooks.while_dispatching = shared_experts;
  const RoutedOutput routed = routed_experts(flat, r.idx, r.weights, Nr, p.experts, m.expert_group, selective, ExpertKernels::kAuto, hooks);
  if (!hooks.while_dispatching) shared_experts();
  const at::Tensor out = shared.defined() ? routed.out + shared : routed.out;
  if (load_row.defined() && sequence.valid.defined()) {  // the tokens the whole rows' forward routes
    const at::Tensor keep = sequence.valid.to(at::kDouble).view({1, T, 1}).expand({B, T, r.idx.size(-1)}).reshape({-1});
    load_row.add_(at::zeros({Nr}, load_row.options()).index_add_(0, r.idx.reshape({-1}).to(load_row.device()), keep.to(load_row.device())));
  } else if (load_row.defined()) {
    load_row.add_(routed.counts.to(at::kDouble));
  }

  if (aux && c.aux_loss_alpha > 0) {
    const at::Tensor loss = balance_loss(c, r, B, T, wide, sequence).to(x.scalar_type());
    *aux = aux->defined() ? *aux + loss : loss;
  }
  return out.view({B, T, H});
}

// One decoder layer: {x} -> {x, and its balance loss when it has one and `want_aux`}.
std::vector<at::Tensor> decoder_layer(const MlaMoeModel::Impl& m, int64_t i, at::Tensor x, const AttentionScope& scope, bool want_aux,
                                      const at::Tensor& load_row, bool selective, KvCache* cache, const SequenceTokens& tokens) {
  const auto& c = m.cfg;
  const MlaLayerParts& p = m.layers[static_cast<size_t>(i)];
  x = x + mla(m, p, rms_norm(x, p.input_norm, c.rms_norm_eps, selective), scope, selective, cache, i);
  const at::Tensor h = rms_norm(x, p.post_attention_norm, c.rms_norm_eps, selective);
  if (!c.is_moe_layer(i)) return {x + swiglu(h, p.mlp, selective)};
  at::Tensor layer_aux;
  x = x + moe(m, p, h, want_aux ? &layer_aux : nullptr, load_row, selective, tokens);
  return layer_aux.defined() ? std::vector<at::Tensor>{x, layer_aux} : std::vector<at::Tensor>{x};
}

// One decoder layer as a region (model/recompute.h), run whole or recomputed in backward: {x} ->
// {x, and its balance loss when it has one}. Held by value: a recomputed layer runs again in
// backward, and the expert load counts once.
std::vector<at::Tensor> run_layer(const MlaMoeModel::Impl& m, int64_t i, const at::Tensor& x, const AttentionScope& scope, bool want_aux,
                                  const at::Tensor& load_row, config::Recompute mode, KvCache* cache = nullptr,
                                  std::optional<SequenceTokens> given = std::nullopt) {
  const bool selective = mode == config::Recompute::kSelective;
  const MlaMoeModel::Impl* mp = &m;
  const SequenceTokens tokens = given ? *given : sequence_tokens(scope, x.size(1));
  const Region layer = [mp, i, load_row, scope, selective, want_aux, cache, tokens](const std::vector<at::Tensor>& in, bool again) {
    return decoder_layer(*mp, i, in[0], scope, want_aux, again ? at::Tensor() : load_row, selective, cache, tokens);
  };
  return mode == config::Recompute::kFull ? recompute(layer, {x}) : layer({x}, false);
}

// Multi-token prediction (DeepSeek-V3 §2.2), depth k = 1..D on positions i < T - k: the previous
// depth's hidden state (k = 1: the main model's output after its final norm, as Megatron and the
// serving engines that run the released module feed it) and the embedding of token i + k, each
// RMS-normed, concatenated embedding first (the released eh_proj's order), projected, then one
// decoder block with the original positions and the attention scope cut to T - k. Returns each
// depth's output after shared_head.norm [B, T - k, H]; the next depth takes it before that norm.
std::vector<at::Tensor> mtp_hidden(const MlaMoeModel::Impl& m, const at::Tensor& hidden, const at::Tensor& embedded,
                                   const AttentionScope& scope, at::Tensor* aux, int64_t moe_row, config::Recompute mode) {
  const auto& c = m.cfg;
  const int64_t T = hidden.size(1);
  // Sequence parallelism: `embedded` runs D tokens past this rank's T (the next rank's first), and
  // each depth keeps all T positions (the attention exchanges need every rank's T alike); the
  // positions past the whole rows' T - k are computed, left out of the MoE statistics, and train
  // nothing (model/mtp_loss.cpp).
  const bool sharded = embedded.size(1) > T;
  const int64_t S = sharded ? scope.sequence->world_size() : 1, begin = sharded ? scope.sequence->rank() * T : 0;
  if (T * S <= c.mtp_depth)
    throw Error(ErrorCode::kConfig,
                fmt::format("model.mtp_depth {} leaves no position to predict from in a sequence of {}", c.mtp_depth, T * S),
                "train on longer sequences (data.seq_len), or lower model.mtp_depth");
  std::vector<at::Tensor> out;
  at::Tensor h = hidden;
  for (int64_t k = 1; k <= c.mtp_depth; ++k) {
    const int64_t i = c.num_layers + k - 1, n = sharded ? T : T - k;
    const MlaLayerParts& p = m.layers[static_cast<size_t>(i)];
    const at::Tensor e = rms_norm(embedded.narrow(1, k, n), p.enorm, c.rms_norm_eps);
    const at::Tensor x = apply(*p.eh_proj, at::cat({e, rms_norm(h.narrow(1, 0, n), p.hnorm, c.rms_norm_eps)}, -1));
    const at::Tensor load_row = c.is_moe_layer(i) ? m.load[moe_row++] : at::Tensor();
    std::optional<SequenceTokens> tokens;
    if (sharded) tokens = SequenceTokens{scope.sequence, (at::arange(T, at::kLong) + begin).lt(T * S - k).to(x.device()), T * S - k};
    const std::vector<at::Tensor> layer =
        run_layer(m, i, x, sharded ? scope : scope.first(n), aux != nullptr, load_row, mode, nullptr, tokens);
    if (layer.size() > 1) *aux = aux->defined() ? *aux + layer[1] : layer[1];
    h = layer[0];
    out.push_back(rms_norm(h, p.shared_head_norm, c.rms_norm_eps));
  }
  return out;
}

}  // namespace

CausalLM::Trunk MlaMoeModel::trunk(int first, int last, const at::Tensor& x_in, const Input& input, at::Tensor* aux) const {
  const Impl& m = *impl_;
  const auto& c = m.cfg;
  if (aux) *aux = at::Tensor();
  const int final_group = static_cast<int>(c.num_layers) + 1;
  const AttentionScope scope = input.scope();
  // MTP reads the embeddings' output: this forward's, or on a later pipeline stage the one the
  // stages before passed on.
  const bool with_mtp = c.mtp_depth > 0 && aux && c10::GradMode::is_enabled();
  at::Tensor x = x_in, embedded = input.embedded;
  if (first == 0) {
    check_held(0);
    enter_group(0);
    // Sequence parallelism with MTP: the tokens after this rank's share too, in the same lookup.
    const bool ahead = with_mtp && input.ahead_tokens.defined();
    x = embedded = leave_group(0, at::embedding(m.embed, ahead ? at::cat({input.tokens, input.ahead_tokens}, 1) : input.tokens));
    if (ahead) x = x.narrow(1, 0, input.tokens.size(1));
  }
  int64_t moe_index = 0;  // the load's row of the next MoE layer
  for (int64_t i = 0; i < std::max(first, 1) - 1; ++i) moe_index += c.is_moe_layer(i) ? 1 : 0;
  for (int group = std::max(first, 1); group <= std::min(last, final_group - 1); ++group) {
    const int64_t i = group - 1;
    check_held(group);
    enter_group(group);
    // Generation (a cache) leaves the expert load alone: it counts what training routes.
    const at::Tensor load_row = c.is_moe_layer(i) && !input.cache ? m.load[moe_index] : at::Tensor();
    moe_index += c.is_moe_layer(i) ? 1 : 0;
    const std::vector<at::Tensor> out = run_layer(m, i, x, scope, aux != nullptr, load_row, recompute_mode_, input.cache);
    if (out.size() > 1) *aux = aux->defined() ? *aux + out[1] : out[1];
    x = leave_group(group, out[0]);
  }
  if (last < final_group) return {x, {}, last, {}, with_mtp ? embedded : at::Tensor()};
  check_held(final_group);
  enter_group(final_group);
  Trunk t{rms_norm(x, m.final_norm, c.rms_norm_eps), m.head, final_group};
  // MTP trains with the model: in forwards that record gradients (not evaluation's).
  if (with_mtp) {
    if (!embedded.defined())
      throw Error(ErrorCode::kInternal, "multi-token prediction on a pipeline stage without the embeddings", "report this as a bug");
    int64_t mtp_row = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) mtp_row += c.is_moe_layer(i) ? 1 : 0;
    t.mtp = mtp_hidden(m, t.hidden, embedded, scope, aux, mtp_row, recompute_mode_);
  }
  return t;
}

}  // namespace dstrain::model
