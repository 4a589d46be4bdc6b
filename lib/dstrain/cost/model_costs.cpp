#include "dstrain/cost/model_costs.h"

#include "dstrain/config/reference_mode.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace dstrain::cost {

using namespace config;

ParameterCounts decoder_layer_counts(const ModelConfig& m, int64_t layer) {
  const int64_t H = m.hidden_size, I = m.intermediate_size, nh = m.num_heads;
  if (m.family == ModelFamily::kDense) {
    const int64_t d = H / nh, kv = m.num_kv_heads > 0 ? m.num_kv_heads : nh;
    const int64_t per_layer = H * nh * d + 2 * H * kv * d + nh * d * H + 3 * H * I + 2 * H;
    return {per_layer, per_layer, 0};
  }
  const int64_t qr = m.q_lora_rank, kvr = m.kv_lora_rank, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int64_t dqk = dn + dr, mi = m.moe_intermediate_size, nr = m.n_routed_experts, ns = m.n_shared_experts, k = m.num_experts_per_tok;
  const int64_t attn = (qr == 0 ? H * nh * dqk : H * qr + qr + qr * nh * dqk) + H * (kvr + dr) + kvr + kvr * nh * (dn + dv) + nh * dv * H;
  const int64_t norms = 2 * H;
  if (!m.is_moe_layer(layer)) return {attn + norms + 3 * H * I, attn + norms + 3 * H * I, 0};
  const int64_t router = nr * H + (m.topk_method == TopkMethod::kNoauxTc ? nr : 0);
  const int64_t moe_total = nr * 3 * H * mi + 3 * H * mi * ns + router;
  const int64_t moe_active = k * 3 * H * mi + 3 * H * mi * ns + router;
  return {attn + norms + moe_total, attn + norms + moe_active, 0, nr * 3 * H * mi};
}

int64_t head_rows(const ModelConfig& m) { return m.score_head ? 1 : m.vocab_size; }

ParameterCounts parameter_counts(const ModelConfig& m) {
  const int64_t H = m.hidden_size, V = m.vocab_size;
  const int64_t embeddings = V * H + head_rows(m) * H + H;  // embed_tokens, lm_head (or a reward model's score), final norm
  ParameterCounts c{embeddings, embeddings, V * H};
  for (int64_t layer = 0; layer < m.num_layers; ++layer) {
    const ParameterCounts l = decoder_layer_counts(m, layer);
    c.total += l.total, c.active += l.active, c.routed += l.routed;
  }
  const ParameterCounts mtp = mtp_module_counts(m);
  c.total += mtp.total, c.active += mtp.active, c.routed += mtp.routed, c.mtp = mtp.total;
  return c;
}

ParameterCounts mtp_module_counts(const ModelConfig& m) {
  ParameterCounts c{0, 0, 0};
  for (int64_t k = 1; k <= m.mtp_depth; ++k) {
    const ParameterCounts l = decoder_layer_counts(m, m.num_layers + k - 1);
    const int64_t own = 3 * m.hidden_size + 2 * m.hidden_size * m.hidden_size;
    c.total += l.total + own, c.active += l.active + own, c.routed += l.routed;
  }
  c.mtp = c.total;
  return c;
}

double flops_per_token(const ModelConfig& m, int64_t seq_len) {
  const ParameterCounts c = parameter_counts(m);
  // The head runs once more per MTP depth (its parameters count once in `active`).
  const double head_again = static_cast<double>(m.mtp_depth * m.vocab_size * m.hidden_size);
  const double matmul = 6.0 * (static_cast<double>(c.active - c.embedding) + head_again);
  return matmul + static_cast<double>(m.num_layers + m.mtp_depth) * attention_flops_per_token(m, seq_len);
}

double attention_flops_per_token(const ModelConfig& m, int64_t seq_len) {
  const double dqk = m.family == ModelFamily::kDense ? static_cast<double>(m.hidden_size / m.num_heads)
                                                     : static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim);
  const double dv = m.family == ModelFamily::kDense ? dqk : static_cast<double>(m.v_head_dim);
  return 6.0 * static_cast<double>(m.num_heads * seq_len) * (dqk + dv);
}

bool param_shard_on_host(const Recipe& r) {
  return r.zero.stage == 3 && r.zero.offload_param == OffloadDevice::kCpu && r.zero.offload_optimizer == OffloadDevice::kCpu;
}

RankParameters rank_parameters(const Recipe& r) {
  const ParameterCounts c = parameter_counts(r.model);
  const double ep = static_cast<double>(r.moe.expert_parallel_size);
  RankParameters out;
  out.dense = static_cast<double>(c.total - c.routed);
  out.experts = static_cast<double>(c.routed) / ep;  // this rank's block of every MoE layer's routed experts
  const double ranks =
      static_cast<double>(r.layout().data());  // the world, less a pipeline's other stages (a sequence group's ranks count)
  out.dense_ranks = ranks, out.expert_ranks = ranks / ep;
  const int last_group = static_cast<int>(r.model.num_layers) + 1;
  out.dense += r.frozen.adapters_in(0, last_group);                // lora's adapters: held with their layers
  out.experts += r.frozen.routed_adapters_in(0, last_group) / ep;  // lora.experts': with their experts
  out.frozen_dense = r.frozen.in_groups(0, last_group, false), out.frozen_experts = r.frozen.in_groups(0, last_group, true) / ep;
  out.quantized_dense = r.frozen.quantized_in(0, last_group, false),
  out.quantized_experts = r.frozen.quantized_in(0, last_group, true) / ep;
  const double dense_trained = out.dense - out.frozen_dense, experts_trained = out.experts - out.frozen_experts;
  out.shard = r.zero.stage == 0 ? dense_trained + experts_trained : dense_trained / out.dense_ranks + experts_trained / out.expert_ranks;
  return out;
}

ModelStateMemory model_state_memory(const Recipe& r) {
  const RankParameters held = rank_parameters(r);
  ModelStateMemory m = model_state_bytes(r, held.dense, held.dense_ranks, held.experts, held.expert_ranks, held.frozen_dense,
                                         held.frozen_experts, held.quantized_dense, held.quantized_experts);
  if (config::keeps_reference_copy(r)) {  // a frozen copy of the starting model, sharded as the policy is
    const ModelStateMemory copy =
        model_state_bytes(r, held.dense, held.dense_ranks, held.experts, held.expert_ranks, held.dense, held.experts);
    m.device_bytes += copy.device_bytes, m.host_bytes += copy.host_bytes;
  }
  return m;
}

double lora_base_bytes_per_element(const Recipe& r) {
  switch (r.lora.base) {
    case LoraBase::kNf4:
      return 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0);
    case LoraBase::kFp8:
      return 1.0 + 4.0 / (128.0 * 128.0);
    case LoraBase::kModel:
      break;
  }
  return r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0;
}

ModelStateMemory model_state_bytes(const Recipe& r, double dense, double dense_ranks, double experts, double expert_ranks,
                                   double frozen_dense, double frozen_experts, double quantized_dense, double quantized_experts) {
  const bool mixed = r.precision.dtype != Dtype::kFp32;
  // The engine keeps a separate fp32 master copy in fp32 training too, as DeepSpeed does.
  const double param = mixed ? 2 : 4, grad = mixed ? 2 : 4, states = 12;  // bytes per parameter
  ModelStateMemory mem{0, 0};
  // The dense parameters are sharded over the world, the routed experts (expert parallelism)
  // over the ranks holding the same block.
  // Frozen parameters keep their values only: no gradient, master copy or Adam states.
  // A quantized base (lora.base) is no engine parameter: its storage, whole, on the device.
  const double quantized_bytes = lora_base_bytes_per_element(r);
  for (const auto& [all, n, frozen, quantized] : {std::tuple{dense, dense_ranks, frozen_dense, quantized_dense},
                                                  std::tuple{experts, expert_ranks, frozen_experts, quantized_experts}}) {
    double p = param, g = grad, s = states;
    if (r.zero.stage >= 1) s /= n;
    if (r.zero.stage >= 2) g /= n;
    if (r.zero.stage >= 3) p /= n;
    const double psi = all - quantized, trained = all - frozen;
    mem.device_bytes += psi * p + trained * (g + s) + quantized * quantized_bytes;
    if (r.zero.offload_optimizer == OffloadDevice::kCpu) mem.device_bytes -= trained * s, mem.host_bytes += trained * s;
    if (param_shard_on_host(r)) mem.device_bytes -= psi * p, mem.host_bytes += psi * p;
  }
  return mem;
}

double activation_bytes_estimate(const Recipe& r) {
  const ActivationParts a = activation_parts(r);
  // Each MTP depth keeps one more layer's activations and computes one more loss over the head.
  const double depths = static_cast<double>(r.model.mtp_depth);
  return static_cast<double>(r.model.num_layers + r.model.mtp_depth) * a.per_layer + a.working + a.loss * (1.0 + depths);
}

ActivationParts activation_parts(const Recipe& r) {
  const auto& m = r.model;
  // Sequence parallelism: every rank holds T / S tokens, and heads / S heads of the whole sequence's scores.
  const double S = static_cast<double>(std::max<int64_t>(1, r.parallel.sequence_parallel_size));
  const double B = static_cast<double>(r.train.micro_batch_size), T = static_cast<double>(r.data.seq_len) / S;
  const double H = static_cast<double>(m.hidden_size), heads = static_cast<double>(m.num_heads);
  const double elem = r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0;
  // Fused (flash) attention keeps no T x T scores; an explicit document mask takes the kernels that do.
  const double scores = r.data.document_mask ? 5.0 * heads * T * S : 0.0;
  const double per_layer = B * T * (34.0 * H + scores) * elem / 2.0;
  ActivationParts out{per_layer, 0, 0};
  switch (r.train.activation_checkpointing) {
    case Recompute::kFull:  // every layer's input, and one layer's activations while it is recomputed
      out = {B * T * H * elem, per_layer, 0};
      break;
    case Recompute::kSelective:  // no scores, norms or element-wise intermediates: the GEMM outputs
      out = {B * T * 26.0 * H * elem / 2.0, 0, 0};
      break;
    case Recompute::kNone:
      break;
  }
  const double V = static_cast<double>(head_rows(m));  // a reward model's score head: one logit per token
  const double chunk = static_cast<double>(r.train.loss_chunk_tokens);
  // Unchunked: the logits, their fp32 copy and its gradient, for every token. Chunked: one chunk's
  // logits (model dtype, fp32, the gradient in the model dtype), plus the hidden states' and the
  // head's gradients (fp32) that the loss holds until backward.
  out.loss =
      chunk <= 0 ? B * T * V * (4.0 + 4.0 + elem) : std::min(B * T, chunk) * V * (elem + 4.0 + elem) + B * T * H * elem + V * H * 4.0;
  return out;
}

pipeline::LayerCosts layer_costs(const ModelConfig& m, int64_t seq_len) {
  pipeline::LayerCosts c;
  const double attention = attention_flops_per_token(m, seq_len);
  for (int64_t layer = 0; layer < m.num_layers; ++layer)
    c.layers.push_back(6.0 * static_cast<double>(decoder_layer_counts(m, layer).active) + attention);
  c.embedding = 0;  // a gather
  c.head = 6.0 * static_cast<double>(head_rows(m) * m.hidden_size + m.hidden_size);
  // The MTP modules run on the last stage with the head: each a decoder block, its projections
  // and one more pass through the head.
  const double depths = static_cast<double>(m.mtp_depth);
  c.head += 6.0 * (static_cast<double>(mtp_module_counts(m).active) + depths * static_cast<double>(m.vocab_size * m.hidden_size)) +
            depths * attention;
  return c;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string count_text(double v) {
  if (v >= 1e12) return fmt::format("{:.2f}T", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:g}", v);
}

}  // namespace dstrain::cost
