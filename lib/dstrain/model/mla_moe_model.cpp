#include "dstrain/model/mla_moe_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/moe_experts.h"
#include "dstrain/model/recompute.h"

namespace dstrain::model {

struct MlaMoeModel::Impl {
  config::ModelConfig cfg;
  NamedTensors params, buffers;
  std::map<std::string, at::Tensor> by_name;
  std::vector<std::string> expert_names;             // by parameter: a routed expert's name with "{}" for its global index, else empty
  Rope rope;                                         // over qk_rope_head_dim
  at::Tensor load;                                   // [moe layers, N_r] tokens routed since take_expert_load (float64 counts)
  std::vector<int64_t> moe_layers;                   // every MoE layer of the model (the load's rows), held or not
  comm::Communicator* expert_group = nullptr;        // expert parallelism: the ranks the routed experts are spread over
  int64_t first_expert = 0, local_experts = 0;       // the routed experts this rank holds: [first, first + local)
  mutable std::atomic<int64_t> exchange_wait_ns{0};  // blocked on the expert all-to-alls since take_all_to_all_wait_ms

  const at::Tensor& p(const std::string& name) const { return by_name.at(name); }
  bool has(const std::string& name) const { return by_name.count(name) > 0; }
};

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
  // Every rank draws every expert's initial weights (the same stream as without expert
  // parallelism, so the same model) and keeps its own.
  auto mine = [&](int64_t e) { return e >= m.first_expert && e < m.first_expert + m.local_experts; };
  const int64_t H = c.hidden_size, V = c.vocab_size, nh = c.num_heads, dqk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // Init: N(0, init_std) for matrices, ones for norms; residual projections (o_proj, down_proj)
  // scaled by 1/sqrt(2 * layers), as GPT-2 and Megatron do, so the residual stream's variance
  // does not grow with depth.
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  int group = 0;                                           // the embeddings, then each decoder layer, then the final norm and head
  int64_t expert = -1;                                     // a routed expert's parameters: its index in this rank's block
  std::string expert_of;                                   // ... and its name with the expert's global index left open
  auto add = [&](const std::string& name, at::Tensor t) {  // drawn in any case: the same stream as the whole model's
    if (!holds_group(group)) return;
    declare_place({group, expert, t.dim() >= 2});
    m.expert_names.push_back(expert < 0 ? std::string() : expert_of);
    t = t.to(dtype).set_requires_grad(true);
    m.params.push_back({name, t});
    m.by_name[name] = t;
  };
  const bool meta = init == Init::kShapesOnly;
  auto normal = [&](std::vector<int64_t> shape, double std) { return meta ? meta_tensor(shape) : at::normal(0.0, std, shape, gen); };
  auto ones = [&](std::vector<int64_t> shape) { return meta ? meta_tensor(shape) : at::ones(shape); };
  add("model.embed_tokens.weight", normal({V, H}, c.init_std));
  // A decoder layer's parameters (and V3's selection bias), the main model's or an MTP module's.
  auto add_decoder_layer = [&](int64_t i) {
    const std::string l = fmt::format("model.layers.{}.", i);
    add(l + "input_layernorm.weight", ones({H}));
    if (c.q_lora_rank > 0) {
      add(l + "self_attn.q_a_proj.weight", normal({c.q_lora_rank, H}, c.init_std));
      add(l + "self_attn.q_a_layernorm.weight", ones({c.q_lora_rank}));
      add(l + "self_attn.q_b_proj.weight", normal({nh * dqk, c.q_lora_rank}, c.init_std));
    } else {
      add(l + "self_attn.q_proj.weight", normal({nh * dqk, H}, c.init_std));
    }
    add(l + "self_attn.kv_a_proj_with_mqa.weight", normal({c.kv_lora_rank + c.qk_rope_head_dim, H}, c.init_std));
    add(l + "self_attn.kv_a_layernorm.weight", ones({c.kv_lora_rank}));
    add(l + "self_attn.kv_b_proj.weight", normal({nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, c.init_std));
    add(l + "self_attn.o_proj.weight", normal({H, nh * c.v_head_dim}, residual_std));
    add(l + "post_attention_layernorm.weight", ones({H}));
    if (!c.is_moe_layer(i)) {
      add(l + "mlp.gate_proj.weight", normal({c.intermediate_size, H}, c.init_std));
      add(l + "mlp.up_proj.weight", normal({c.intermediate_size, H}, c.init_std));
      add(l + "mlp.down_proj.weight", normal({H, c.intermediate_size}, residual_std));
      return;
    }
    m.moe_layers.push_back(i);
    add(l + "mlp.gate.weight", normal({c.n_routed_experts, H}, c.init_std));
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string x = fmt::format("{}mlp.experts.{}.", l, e);
      at::Tensor gate = normal({c.moe_intermediate_size, H}, c.init_std), up = normal({c.moe_intermediate_size, H}, c.init_std),
                 down = normal({H, c.moe_intermediate_size}, residual_std);
      if (!mine(e)) continue;
      expert = e - m.first_expert;
      for (const auto& [proj, value] : {std::pair<const char*, at::Tensor>{"gate_proj", gate}, {"up_proj", up}, {"down_proj", down}}) {
        expert_of = l + "mlp.experts.{}." + proj + ".weight";
        add(x + proj + ".weight", value);
      }
      expert = -1;
    }
    if (c.n_shared_experts > 0) {
      const int64_t w = c.moe_intermediate_size * c.n_shared_experts;
      add(l + "mlp.shared_experts.gate_proj.weight", normal({w, H}, c.init_std));
      add(l + "mlp.shared_experts.up_proj.weight", normal({w, H}, c.init_std));
      add(l + "mlp.shared_experts.down_proj.weight", normal({H, w}, residual_std));
    }
    if (c.topk_method == config::TopkMethod::kNoauxTc && holds_group(group)) {
      const std::string name = l + "mlp.gate.e_score_correction_bias";
      const at::Tensor bias = at::zeros({c.n_routed_experts}, at::kFloat);  // fp32, no gradient, no decay
      m.buffers.push_back({name, bias});
      m.by_name[name] = bias;
    }
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    group = static_cast<int>(i) + 1;
    add_decoder_layer(i);
  }
  group = static_cast<int>(c.num_layers) + 1;
  add("model.norm.weight", ones({H}));
  add("lm_head.weight", normal({V, H}, c.init_std));
  // Multi-token prediction: module k is HF's layer L + k - 1 (enorm, hnorm, eh_proj, a decoder
  // block, shared_head.norm), in the final group with the head it shares; drawn after the main
  // model, whose initial values MTP does not change.
  for (int64_t k = 1; k <= c.mtp_depth; ++k) {
    const int64_t i = c.num_layers + k - 1;
    const std::string l = fmt::format("model.layers.{}.", i);
    add(l + "enorm.weight", ones({H}));
    add(l + "hnorm.weight", ones({H}));
    add(l + "eh_proj.weight", normal({H, 2 * H}, c.init_std));
    add_decoder_layer(i);
    add(l + "shared_head.norm.weight", ones({H}));
  }
  if (!meta) m.rope = Rope(c.qk_rope_head_dim, c, dtype);
  m.load = at::zeros({static_cast<int64_t>(m.moe_layers.size()), c.n_routed_experts}, at::kDouble);
}

MlaMoeModel::~MlaMoeModel() = default;

const NamedTensors& MlaMoeModel::parameters() const { return impl_->params; }
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

std::string MlaMoeModel::expert_parameter_name(size_t index, int64_t expert) const {
  const std::string& pattern = impl_->expert_names.at(index);
  return pattern.empty() ? parameters().at(index).name : fmt::format(fmt::runtime(pattern), expert);
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
    const at::Tensor counts = global_load[static_cast<int64_t>(k)].to(impl_->load.device(), at::kFloat);
    // b_i += gamma * sign(mean - c_i): underloaded experts become more attractive.
    impl_->p(fmt::format("model.layers.{}.mlp.gate.e_score_correction_bias", impl_->moe_layers[k]))
        .add_(at::sign(counts.mean() - counts), c.bias_update_speed);
  }
}

namespace {

// MLA's attention core: RoPE, the per-head K and V, and SDPA from the projections' outputs.
at::Tensor mla_core(const MlaMoeModel::Impl& m, const at::Tensor& q_flat, const at::Tensor& ckv, const at::Tensor& kv_lin,
                    const at::Tensor& attention_mask, const at::Tensor& positions) {
  const auto& c = m.cfg;
  const int64_t B = q_flat.size(0), T = q_flat.size(1), nh = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim;
  const at::Tensor q = q_flat.view({B, T, nh, dn + dr}).transpose(1, 2);                             // [B, nh, T, dqk]
  const at::Tensor k_pe = m.rope.apply(ckv.narrow(-1, c.kv_lora_rank, dr).unsqueeze(1), positions);  // one head, shared: [B, 1, T, dr]
  const at::Tensor kv = kv_lin.view({B, T, nh, dn + dv}).transpose(1, 2);
  const at::Tensor query = at::cat({q.narrow(-1, 0, dn), m.rope.apply(q.narrow(-1, dn, dr), positions)}, -1);
  const at::Tensor key = at::cat({kv.narrow(-1, 0, dn), k_pe.expand({B, nh, T, dr})}, -1);
  const at::Tensor value = kv.narrow(-1, dn, dv);
  // (d_nope + d_rope)^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 under scaling (as HF does).
  const double scale = deepseek_softmax_mscale(c) / std::sqrt(static_cast<double>(dn + dr));
  const at::Tensor o = attention_mask.defined()
                           ? at::scaled_dot_product_attention(query, key, value, attention_mask, 0.0, /*is_causal=*/false, scale)
                           : at::scaled_dot_product_attention(query, key, value, {}, 0.0, /*is_causal=*/true, scale);
  return o.transpose(1, 2).reshape({B, T, nh * dv});
}

// MLA, the training form: per-head K and V are materialised from the compressed latent.
// `selective`: the norms and the attention core (RoPE, SDPA) are recomputed in backward from
// the projections' outputs, which are kept.
at::Tensor mla(const MlaMoeModel::Impl& m, const std::string& l, const at::Tensor& h, const at::Tensor& attention_mask,
               const at::Tensor& positions, bool selective) {
  const auto& c = m.cfg;
  const at::Tensor q_flat = c.q_lora_rank > 0 ? at::linear(rms_norm(at::linear(h, m.p(l + "self_attn.q_a_proj.weight")),
                                                                    m.p(l + "self_attn.q_a_layernorm.weight"), c.rms_norm_eps, selective),
                                                           m.p(l + "self_attn.q_b_proj.weight"))
                                              : at::linear(h, m.p(l + "self_attn.q_proj.weight"));
  const at::Tensor ckv = at::linear(h, m.p(l + "self_attn.kv_a_proj_with_mqa.weight"));  // [B, T, kvr + dr]
  const at::Tensor kv_lin =
      at::linear(rms_norm(ckv.narrow(-1, 0, c.kv_lora_rank), m.p(l + "self_attn.kv_a_layernorm.weight"), c.rms_norm_eps, selective),
                 m.p(l + "self_attn.kv_b_proj.weight"));
  const MlaMoeModel::Impl* mp = &m;
  const Region core = [mp, attention_mask, positions](const std::vector<at::Tensor>& in, bool) {
    return std::vector<at::Tensor>{mla_core(*mp, in[0], in[1], in[2], attention_mask, positions)};
  };
  const at::Tensor o = selective ? recompute(core, {q_flat, ckv, kv_lin}).at(0) : core({q_flat, ckv, kv_lin}, false).at(0);
  return at::linear(o, m.p(l + "self_attn.o_proj.weight"));
}

// DeepSeekMoE over x [B, T, H]. Adds this layer's balance loss to *aux and its expert load to
// `load_row` (when defined). `selective`: the experts' SwiGLU activations are recomputed in backward.
at::Tensor moe(const MlaMoeModel::Impl& m, const std::string& l, const at::Tensor& x, at::Tensor* aux, at::Tensor load_row,
               bool selective) {
  const auto& c = m.cfg;
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), N = B * T, Nr = c.n_routed_experts, K = c.num_experts_per_tok;
  const at::Tensor flat = x.reshape({N, H});
  // Router in fp32 (or wider, for gradient checks).
  const auto wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor router_logits = at::linear(flat.to(wide), m.p(l + "mlp.gate.weight").to(wide));
  const at::Tensor scores = c.scoring_func == config::ScoringFunc::kSigmoid ? at::sigmoid(router_logits) : at::softmax(router_logits, -1);
  at::Tensor choice = scores.detach();
  if (c.topk_method == config::TopkMethod::kNoauxTc) choice = choice + m.p(l + "mlp.gate.e_score_correction_bias").to(wide);
  if (c.topk_method != config::TopkMethod::kGreedy && c.n_group > 1) {
    const at::Tensor grouped = choice.view({N, c.n_group, Nr / c.n_group});
    const at::Tensor group_score = c.topk_method == config::TopkMethod::kNoauxTc
                                       ? std::get<0>(grouped.topk(std::min<int64_t>(2, Nr / c.n_group), -1)).sum(-1)
                                       : std::get<0>(grouped.max(-1));
    const at::Tensor keep_groups = std::get<1>(group_score.topk(c.topk_group, -1));
    const at::Tensor group_mask = at::zeros({N, c.n_group}, x.options().dtype(at::kBool)).scatter_(1, keep_groups, true);
    choice = choice.masked_fill(~group_mask.unsqueeze(-1).expand({N, c.n_group, Nr / c.n_group}).reshape({N, Nr}), -INFINITY);
  }
  const at::Tensor idx = std::get<1>(choice.topk(K, -1));  // [N, K]
  at::Tensor weights = scores.gather(1, idx);              // the unbiased scores
  if (c.norm_topk_prob) weights = weights / (weights.sum(-1, true) + 1e-20);
  if (!c.norm_topk_prob || c.scoring_func == config::ScoringFunc::kSigmoid) weights = weights * c.routed_scaling_factor;

  LocalExperts experts;
  experts.first = m.first_expert;
  for (int64_t e = m.first_expert; e < m.first_expert + m.local_experts; ++e) {
    const std::string p = fmt::format("{}mlp.experts.{}.", l, e);
    experts.gate.push_back(m.p(p + "gate_proj.weight"));
    experts.up.push_back(m.p(p + "up_proj.weight"));
    experts.down.push_back(m.p(p + "down_proj.weight"));
  }
  // The shared experts run while the routed tokens are dispatched to their experts' ranks.
  at::Tensor shared;
  auto shared_experts = [&] {
    if (c.n_shared_experts > 0)
      shared = swiglu(flat, m.p(l + "mlp.shared_experts.gate_proj.weight"), m.p(l + "mlp.shared_experts.up_proj.weight"),
                      m.p(l + "mlp.shared_experts.down_proj.weight"), selective);
  };
  static const bool overlap = [] {  // DSTRAIN_EP_OVERLAP=0: after the exchange (for measuring what overlap hides)
    const char* v = std::getenv("DSTRAIN_EP_OVERLAP");
    return !(v && std::string(v) == "0");
  }();
  ExchangeHooks hooks;
  hooks.wait_ns = &m.exchange_wait_ns;
  if (m.expert_group && overlap) hooks.while_dispatching = shared_experts;
  const RoutedOutput routed = routed_experts(flat, idx, weights, Nr, experts, m.expert_group, selective, ExpertKernels::kAuto, hooks);
  if (!hooks.while_dispatching) shared_experts();
  const at::Tensor out = shared.defined() ? routed.out + shared : routed.out;
  if (load_row.defined()) load_row.add_(routed.counts.to(at::kDouble));

  // Sequence-wise balance loss: alpha * mean_b sum_i f_{b,i} P_{b,i}, f = N_r/(K T) * selections,
  // P = mean over the sequence of the (normalised) scores.
  if (aux && c.aux_loss_alpha > 0) {
    const at::Tensor per_seq =
        at::zeros({B, Nr}, x.options().dtype(wide)).scatter_add_(1, idx.view({B, T * K}), at::ones({B, T * K}, x.options().dtype(wide)));
    const at::Tensor f = per_seq * (static_cast<double>(Nr) / static_cast<double>(K * T));
    const at::Tensor s = c.scoring_func == config::ScoringFunc::kSigmoid ? scores / scores.sum(-1, true) : scores;
    const at::Tensor P = s.view({B, T, Nr}).mean(1);
    const at::Tensor loss = (f * P).sum(-1).mean() * c.aux_loss_alpha;
    *aux = aux->defined() ? *aux + loss.to(x.scalar_type()) : loss.to(x.scalar_type());
  }
  return out.view({B, T, H});
}

// One decoder layer: {x} -> {x, and its balance loss when it has one and `want_aux`}.
std::vector<at::Tensor> decoder_layer(const MlaMoeModel::Impl& m, const std::string& l, int64_t i, at::Tensor x,
                                      const at::Tensor& attention_mask, const at::Tensor& positions, bool want_aux,
                                      const at::Tensor& load_row, bool selective) {
  const auto& c = m.cfg;
  x = x + mla(m, l, rms_norm(x, m.p(l + "input_layernorm.weight"), c.rms_norm_eps, selective), attention_mask, positions, selective);
  const at::Tensor h = rms_norm(x, m.p(l + "post_attention_layernorm.weight"), c.rms_norm_eps, selective);
  if (!c.is_moe_layer(i))
    return {x + swiglu(h, m.p(l + "mlp.gate_proj.weight"), m.p(l + "mlp.up_proj.weight"), m.p(l + "mlp.down_proj.weight"), selective)};
  at::Tensor layer_aux;
  x = x + moe(m, l, h, want_aux ? &layer_aux : nullptr, load_row, selective);
  return layer_aux.defined() ? std::vector<at::Tensor>{x, layer_aux} : std::vector<at::Tensor>{x};
}

// One decoder layer as a region (model/recompute.h), run whole or recomputed in backward: {x} ->
// {x, and its balance loss when it has one}. Held by value: a recomputed layer runs again in
// backward, and the expert load counts once.
std::vector<at::Tensor> run_layer(const MlaMoeModel::Impl& m, int64_t i, const at::Tensor& x, const at::Tensor& attention_mask,
                                  const at::Tensor& positions, bool want_aux, const at::Tensor& load_row, config::Recompute mode) {
  const std::string l = fmt::format("model.layers.{}.", i);
  const bool selective = mode == config::Recompute::kSelective;
  const MlaMoeModel::Impl* mp = &m;
  const Region layer = [mp, l, i, load_row, attention_mask, positions, selective, want_aux](const std::vector<at::Tensor>& in, bool again) {
    return decoder_layer(*mp, l, i, in[0], attention_mask, positions, want_aux, again ? at::Tensor() : load_row, selective);
  };
  return mode == config::Recompute::kFull ? recompute(layer, {x}) : layer({x}, false);
}

// Multi-token prediction (DeepSeek-V3 §2.2), depth k = 1..D on positions i < T - k: the previous
// depth's hidden state (k = 1: the main model's output after its final norm, as Megatron and the
// serving engines that run the released module feed it) and the embedding of token i + k, each
// RMS-normed, concatenated embedding first (the released eh_proj's order), projected, then one
// decoder block with the original positions and the attention mask cut to T - k. Returns each
// depth's output after shared_head.norm [B, T - k, H]; the next depth takes it before that norm.
std::vector<at::Tensor> mtp_hidden(const MlaMoeModel::Impl& m, const at::Tensor& hidden, const at::Tensor& embedded,
                                   const at::Tensor& attention_mask, const at::Tensor& positions, at::Tensor* aux, int64_t moe_row,
                                   config::Recompute mode) {
  const auto& c = m.cfg;
  const int64_t T = hidden.size(1);
  if (T <= c.mtp_depth)
    throw Error(ErrorCode::kConfig,
                fmt::format("model.mtp_depth {} leaves no position to predict from in a sequence of {}", c.mtp_depth, T),
                "train on longer sequences (data.seq_len), or lower model.mtp_depth");
  std::vector<at::Tensor> out;
  at::Tensor h = hidden;
  for (int64_t k = 1; k <= c.mtp_depth; ++k) {
    const int64_t i = c.num_layers + k - 1, n = T - k;
    const std::string l = fmt::format("model.layers.{}.", i);
    const at::Tensor e = rms_norm(embedded.narrow(1, k, n), m.p(l + "enorm.weight"), c.rms_norm_eps);
    const at::Tensor x =
        at::linear(at::cat({e, rms_norm(h.narrow(1, 0, n), m.p(l + "hnorm.weight"), c.rms_norm_eps)}, -1), m.p(l + "eh_proj.weight"));
    const at::Tensor mask = attention_mask.defined() ? attention_mask.narrow(2, 0, n).narrow(3, 0, n) : at::Tensor();
    const at::Tensor pos = positions.defined() ? positions.narrow(1, 0, n) : at::Tensor();
    const at::Tensor load_row = c.is_moe_layer(i) ? m.load[moe_row++] : at::Tensor();
    const std::vector<at::Tensor> layer = run_layer(m, i, x, mask, pos, aux != nullptr, load_row, mode);
    if (layer.size() > 1) *aux = aux->defined() ? *aux + layer[1] : layer[1];
    h = layer[0];
    out.push_back(rms_norm(h, m.p(l + "shared_head.norm.weight"), c.rms_norm_eps));
  }
  return out;
}

}  // namespace

CausalLM::Trunk MlaMoeModel::trunk(int first, int last, const at::Tensor& x_in, const Input& input, at::Tensor* aux) const {
  const Impl& m = *impl_;
  const at::Tensor &inputs = input.tokens, &positions = input.positions, &attention_mask = input.attention_mask;
  const auto& c = m.cfg;
  if (aux) *aux = at::Tensor();
  const int final_group = static_cast<int>(c.num_layers) + 1;
  // MTP reads the embeddings' output: this forward's, or on a later pipeline stage the one the
  // stages before passed on.
  const bool with_mtp = c.mtp_depth > 0 && aux && c10::GradMode::is_enabled();
  at::Tensor x = x_in, embedded = input.embedded;
  if (first == 0) {
    check_held(0);
    enter_group(0);
    x = embedded = leave_group(0, at::embedding(m.p("model.embed_tokens.weight"), inputs));
  }
  int64_t moe_index = 0;  // the load's row of the next MoE layer
  for (int64_t i = 0; i < std::max(first, 1) - 1; ++i) moe_index += c.is_moe_layer(i) ? 1 : 0;
  for (int group = std::max(first, 1); group <= std::min(last, final_group - 1); ++group) {
    const int64_t i = group - 1;
    check_held(group);
    enter_group(group);
    const at::Tensor load_row = c.is_moe_layer(i) ? m.load[moe_index++] : at::Tensor();
    const std::vector<at::Tensor> out = run_layer(m, i, x, attention_mask, positions, aux != nullptr, load_row, recompute_mode_);
    if (out.size() > 1) *aux = aux->defined() ? *aux + out[1] : out[1];
    x = leave_group(group, out[0]);
  }
  if (last < final_group) return {x, {}, last, {}, with_mtp ? embedded : at::Tensor()};
  check_held(final_group);
  enter_group(final_group);
  Trunk t{rms_norm(x, m.p("model.norm.weight"), c.rms_norm_eps), m.p("lm_head.weight"), final_group};
  // MTP trains with the model: in forwards that record gradients (not evaluation's).
  if (with_mtp) {
    if (!embedded.defined())
      throw Error(ErrorCode::kInternal, "multi-token prediction on a pipeline stage without the embeddings", "report this as a bug");
    int64_t mtp_row = 0;
    for (int64_t i = 0; i < c.num_layers; ++i) mtp_row += c.is_moe_layer(i) ? 1 : 0;
    t.mtp = mtp_hidden(m, t.hidden, embedded, attention_mask, positions, aux, mtp_row, recompute_mode_);
  }
  return t;
}

}  // namespace dstrain::model
