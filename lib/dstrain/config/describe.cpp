#include "dstrain/config/describe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <tuple>

#include "dstrain/config/pipeline_plan.h"
#include "dstrain/config/schema.h"

namespace dstrain::config {

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

ParameterCounts parameter_counts(const ModelConfig& m) {
  const int64_t H = m.hidden_size, V = m.vocab_size;
  const int64_t embeddings = 2 * V * H + H;  // embed_tokens, lm_head, final norm
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

namespace {
// Stage 3 offload_param (with offload_optimizer): the parameter shard is host memory.
bool param_shard_on_host(const Recipe& r) {
  return r.zero.stage == 3 && r.zero.offload_param == OffloadDevice::kCpu && r.zero.offload_optimizer == OffloadDevice::kCpu;
}
}  // namespace

RankParameters rank_parameters(const Recipe& r) {
  const ParameterCounts c = parameter_counts(r.model);
  const double ep = static_cast<double>(r.moe.expert_parallel_size);
  RankParameters out;
  out.dense = static_cast<double>(c.total - c.routed);
  out.experts = static_cast<double>(c.routed) / ep;                  // this rank's block of every MoE layer's routed experts
  const double ranks = static_cast<double>(r.data_parallel_size());  // the world, less a pipeline's other stages
  out.dense_ranks = ranks, out.expert_ranks = ranks / ep;
  const int last_group = static_cast<int>(r.model.num_layers) + 1;
  out.frozen_dense = r.frozen.in_groups(0, last_group, false), out.frozen_experts = r.frozen.in_groups(0, last_group, true) / ep;
  const double dense_trained = out.dense - out.frozen_dense, experts_trained = out.experts - out.frozen_experts;
  out.shard = r.zero.stage == 0 ? dense_trained + experts_trained : dense_trained / out.dense_ranks + experts_trained / out.expert_ranks;
  return out;
}

ModelStateMemory model_state_memory(const Recipe& r) {
  const RankParameters held = rank_parameters(r);
  return model_state_bytes(r, held.dense, held.dense_ranks, held.experts, held.expert_ranks, held.frozen_dense, held.frozen_experts);
}

ModelStateMemory model_state_bytes(const Recipe& r, double dense, double dense_ranks, double experts, double expert_ranks,
                                   double frozen_dense, double frozen_experts) {
  const bool mixed = r.precision.dtype != Dtype::kFp32;
  // The engine keeps a separate fp32 master copy in fp32 training too, as DeepSpeed does.
  const double param = mixed ? 2 : 4, grad = mixed ? 2 : 4, states = 12;  // bytes per parameter
  ModelStateMemory mem{0, 0};
  // The dense parameters are sharded over the world, the routed experts (expert parallelism)
  // over the ranks holding the same block.
  // Frozen parameters keep their values only: no gradient, master copy or Adam states.
  for (const auto& [psi, n, frozen] : {std::tuple{dense, dense_ranks, frozen_dense}, std::tuple{experts, expert_ranks, frozen_experts}}) {
    double p = param, g = grad, s = states;
    if (r.zero.stage >= 1) s /= n;
    if (r.zero.stage >= 2) g /= n;
    if (r.zero.stage >= 3) p /= n;
    const double trained = psi - frozen;
    mem.device_bytes += psi * p + trained * (g + s);
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
  const double B = static_cast<double>(r.train.micro_batch_size), T = static_cast<double>(r.data.seq_len);
  const double H = static_cast<double>(m.hidden_size), heads = static_cast<double>(m.num_heads);
  const double elem = r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0;
  // Fused (flash) attention keeps no T x T scores; an explicit document mask takes the kernels that do.
  const double scores = r.data.document_mask ? 5.0 * heads * T : 0.0;
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
  const double V = static_cast<double>(m.vocab_size);
  const double chunk = static_cast<double>(r.train.loss_chunk_tokens);
  // Unchunked: the logits, their fp32 copy and its gradient, for every token. Chunked: one chunk's
  // logits (model dtype, fp32, the gradient in the model dtype), plus the hidden states' and the
  // head's gradients (fp32) that the loss holds until backward.
  out.loss =
      chunk <= 0 ? B * T * V * (4.0 + 4.0 + elem) : std::min(B * T, chunk) * V * (elem + 4.0 + elem) + B * T * H * elem + V * H * 4.0;
  return out;
}

MemoryPlan memory_plan(const Recipe& r) {
  MemoryPlan plan;
  if (r.parallel.pipeline_parallel_size > 1) {  // the pipeline rank that needs the most (offload staging not modelled)
    const PipelinePlan pipe = pipeline_plan(r);
    const auto worst = std::max_element(pipe.ranks.begin(), pipe.ranks.end(),
                                        [](const auto& a, const auto& b) { return a.device_total() < b.device_total(); });
    plan.device_states = worst->device_states, plan.device_activations = worst->activations, plan.host_states = worst->host_states;
    return plan;
  }
  const ModelStateMemory states = model_state_memory(r);
  plan.device_states = states.device_bytes;
  plan.host_states = states.host_bytes;
  plan.device_activations = activation_bytes_estimate(r);
  if (r.zero.offload_optimizer == OffloadDevice::kCpu) {
    const double shard = rank_parameters(r).shard;
    const double elem = r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0;
    // Stage 0/1: this rank's gradient chunks gathered into one shard; stages 1/2: the updated
    // chunks in the model dtype (stage 3 updates param_shard in place).
    plan.device_staging = (r.zero.stage <= 1 ? shard * elem : 0.0) + (r.zero.stage == 3 ? 0.0 : shard * elem);
    plan.host_staging = shard * elem;                              // the pinned gradient shard, in the model dtype (GPU runs)
    if (r.zero.delayed_update) plan.host_staging += shard * elem;  // the delayed update's parameters, staged on the host
  }
  if (param_shard_on_host(r)) {  // the gathered layer groups: the running one and the one prefetched
    const auto& m = r.model;
    const double embedding = static_cast<double>(m.vocab_size * m.hidden_size);
    const double psi = static_cast<double>(parameter_counts(m).total);
    const double layer = (psi - 2.0 * embedding) / static_cast<double>(std::max<int64_t>(1, m.num_layers));
    plan.device_staging += 2.0 * std::max(embedding, layer) * (r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0);
  }
  return plan;
}

double largest_model_fitting(const Recipe& r, double device_bytes) {
  const MemoryPlan plan = memory_plan(r);
  const double psi = static_cast<double>(parameter_counts(r.model).total);
  const double per_parameter = (plan.device_states + plan.device_staging) / std::max(psi, 1.0);
  const double room = 0.9 * device_bytes - plan.device_activations;
  return room <= 0 || per_parameter <= 0 ? 0.0 : room / per_parameter;
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

namespace {
// train.freeze: what trains, what does not, and the model states it saves per rank.
std::string frozen_text(const Recipe& r) {
  const int last = static_cast<int>(r.model.num_layers) + 1;
  const double total = static_cast<double>(parameter_counts(r.model).total);
  const double frozen = r.frozen.in_groups(0, last, false) + r.frozen.in_groups(0, last, true);
  Recipe unfrozen = r;
  unfrozen.frozen = {};
  const MemoryPlan with = memory_plan(r), without = memory_plan(unfrozen);
  const double saved = (without.device_states + without.host_states) - (with.device_states + with.host_states);
  return fmt::format(
      "  train.freeze            {} parameters frozen ({:.1f}%), {} trainable; model states per rank {} instead of {} (saves {}: no "
      "gradients, fp32 master or Adam states for the frozen ones)\n",
      count_text(frozen), 100.0 * frozen / std::max(total, 1.0), count_text(total - frozen),
      bytes_text(with.device_states + with.host_states), bytes_text(without.device_states + without.host_states), bytes_text(saved));
}

// Expert parallelism's layout: which ranks exchange tokens, which hold the same experts.
std::string expert_parallel_text(const Recipe& r) {
  const int64_t ep = r.moe.expert_parallel_size, world = r.data_parallel_size();  // expert groups live inside a pipeline stage
  const RankParameters held = rank_parameters(r);
  auto ranks = [](int64_t first, int64_t step, int64_t count) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < std::min<int64_t>(count, 4); ++i) v.push_back(first + i * step);
    return fmt::format("{}{}", fmt::join(v, ","), count > 4 ? ",..." : "");
  };
  return fmt::format(
      "  expert parallelism      {} ranks per group: {} of {} routed experts per rank and MoE layer, tokens dispatched by "
      "all-to-all within {} group(s) {{{}}}{}; each expert data-parallel over {} rank(s) {{{}}}{}; {} routed expert "
      "parameters per rank, {} other{}\n",
      ep, r.model.n_routed_experts / ep, r.model.n_routed_experts, world / ep, ranks(0, 1, ep), world / ep > 1 ? ", ..." : "", world / ep,
      ranks(0, ep, world / ep), ep > 1 ? ", ..." : "", count_text(held.experts), count_text(held.dense),
      r.parallel.pipeline_parallel_size > 1 ? " in the whole model; each pipeline rank holds its stages' share (below)" : "");
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool is_one_of(const std::string& s, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

}  // namespace

bool key_applies(const std::string& path, const Recipe& r) {
  const bool moe = r.model.family == ModelFamily::kMlaMoe;
  if (is_one_of(path, {"model.q_lora_rank",
                       "model.kv_lora_rank",
                       "model.qk_nope_head_dim",
                       "model.qk_rope_head_dim",
                       "model.v_head_dim",
                       "model.moe_intermediate_size",
                       "model.n_routed_experts",
                       "model.n_shared_experts",
                       "model.num_experts_per_tok",
                       "model.first_k_dense_replace",
                       "model.moe_layer_freq",
                       "model.scoring_func",
                       "model.topk_method",
                       "model.n_group",
                       "model.topk_group",
                       "model.norm_topk_prob",
                       "model.routed_scaling_factor",
                       "model.aux_loss_alpha",
                       "model.bias_update_speed",
                       "moe.expert_parallel_size"}))
    return moe;
  if (path == "model.num_kv_heads") return !moe;
  if (path == "model.rope_factor") return r.model.rope_scaling != RopeScaling::kNone;
  if (starts_with(path, "model.rope_") && path != "model.rope_theta" && path != "model.rope_scaling")
    return r.model.rope_scaling == RopeScaling::kYarn;
  if (path == "data.path") return r.data.paths.empty();
  if (path == "data.paths" || path == "data.weights") return !r.data.paths.empty();
  if (path == "data.balance_steps") return r.data.auto_balance;
  if (starts_with(path, "eval.")) return r.eval.enabled() || path == "eval.paths" || path == "eval.split";
  const bool one_cycle = r.schedule.type == ScheduleType::kDsOneCycle;
  if (starts_with(path, "schedule.cycle_") ||
      is_one_of(path, {"schedule.decay_lr_rate", "schedule.decay_step_size", "schedule.decay_mom_rate"}))
    return one_cycle;
  if (path == "schedule.decay_ratio") return r.schedule.type == ScheduleType::kWsd;
  if (is_one_of(path, {"schedule.warmup_type", "schedule.warmup_min_ratio", "schedule.min_lr_ratio"})) return !one_cycle;
  if (path == "train.tokens") return r.train.tokens > 0;
  if (path == "train.accumulation") return !r.train.accumulation.empty();
  if (path == "train.freeze") return !r.train.freeze.empty();
  if (starts_with(path, "train.batch_ramp_")) return r.train.batch_ramp_start > 0;
  if (path == "train.max_bad_steps") return r.train.on_bad_step != BadStepAction::kStop;
  if (starts_with(path, "precision.") && path != "precision.dtype") return r.precision.dtype == Dtype::kFp16;
  if (starts_with(path, "zero.stage3_") || path == "zero.offload_param") return r.zero.stage == 3;
  if (is_one_of(path, {"zero.pin_memory", "zero.delayed_update", "zero.delayed_update_after", "zero.sub_group_size"}))
    return r.zero.offload_optimizer != OffloadDevice::kNone;
  if (path == "logging.tensorboard_dir") return r.logging.has_sink(Sink::kTensorboard);
  if (path == "logging.csv_dir") return r.logging.has_sink(Sink::kCsv);
  if (path == "logging.python" || path == "logging.run_name") return r.logging.has_tracker();
  if (starts_with(path, "logging.wandb_")) return r.logging.has_sink(Sink::kWandb);
  if (path == "logging.mlflow_experiment") return r.logging.has_sink(Sink::kMlflow);
  if (path == "data.other_tokenizer") return !r.model.init_from.empty();
  if (starts_with(path, "logging.straggler_")) return r.world_size() > 1;
  if (starts_with(path, "pipeline.")) return r.parallel.pipeline_parallel_size > 1;
  return true;
}

std::string describe_resolved(const Recipe& recipe, bool show_schedule) {
  Recipe r = recipe;  // value_text reads through the schema's (mutable) targets
  std::string out = fmt::format("resolved config ({}{}):\n", r.source_path, r.ds_config_path.empty() ? "" : " + " + r.ds_config_path);
  // A key the run does not use is left out, unless something set it (then the reader should see it).
  std::vector<const Field*> shown;
  for (const auto& f : recipe_schema()) {
    const auto it = r.sources.find(f.path);
    const bool set = it != r.sources.end() && it->second != "default";
    if (set || key_applies(f.path, r)) shown.push_back(&f);
  }
  size_t width = 0, value_width = 0;
  for (const Field* f : shown) width = std::max(width, f->path.size()), value_width = std::max(value_width, value_text(*f, r).size());
  value_width = std::min<size_t>(value_width, 40);
  for (const Field* f : shown) {
    const auto it = r.sources.find(f->path);
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", f->path, width, value_text(*f, r), value_width, it == r.sources.end() ? "" : it->second);
  }
  const size_t hidden = recipe_schema().size() - shown.size();
  if (hidden > 0)
    out += fmt::format(
        "  ({} keys that this run does not use are not shown, e.g. MoE keys for a dense model; recipes/README.md lists every "
        "key)\n",
        hidden);
  const ParameterCounts params = parameter_counts(r.model);
  const int64_t tokens_total = samples_before(r, r.train.steps) * r.data.seq_len;
  out += "derived:\n";
  out += fmt::format("  ranks                   {} ({} node{} x {} per node)\n", r.world_size(), r.launch.nnodes,
                     r.launch.nnodes == 1 ? "" : "s", r.launch.nproc_per_node);
  if (r.parallel.pipeline_parallel_size > 1)
    out += fmt::format("  data-parallel ranks     {} (world {} / parallel.pipeline_parallel_size {}): the batch math's ranks\n",
                       r.data_parallel_size(), r.world_size(), r.parallel.pipeline_parallel_size);
  out += fmt::format("  micro batch per rank    {}\n", r.train.micro_batch_size);
  if (r.train.accumulation.empty()) {
    out += fmt::format("  accumulation steps      {}\n", accumulation_at(r, 0));
    out += fmt::format("  global batch            {} samples = {} tokens per step\n", global_batch_at(r, 0),
                       global_batch_at(r, 0) * r.data.seq_len);
  } else {
    int64_t from = 0;
    for (const auto& st : r.train.accumulation) {
      const int64_t until = st.until_step ? st.until_step : r.train.steps;
      out += fmt::format("  steps {:>6}..{:<6}     accumulation {}, global batch {} samples = {} tokens per step\n", from, until - 1,
                         st.steps, r.train.micro_batch_size * r.data_parallel_size() * st.steps,
                         r.train.micro_batch_size * r.data_parallel_size() * st.steps * r.data.seq_len);
      from = until;
    }
  }
  out += fmt::format("  total                   {} steps, {} tokens\n", r.train.steps, count_text(static_cast<double>(tokens_total)));
  out += fmt::format(
      "  model                   {} parameters ({}){}\n", count_text(static_cast<double>(params.total)), params.total,
      params.active != params.total ? fmt::format(", {} active per token", count_text(static_cast<double>(params.active))) : "");
  if (!r.frozen.empty()) out += frozen_text(r);
  if (r.model.mtp_depth > 0)
    out += fmt::format(
        "  multi-token prediction  depth {}: {} parameters ({}) of those, in the final group with the shared head; loss "
        "weight {:g}{}\n",
        r.model.mtp_depth, count_text(static_cast<double>(params.mtp)), params.mtp, r.model.mtp_loss_weight,
        r.model.mtp_loss_weight_until_tokens > 0 ? fmt::format(", {:g} after {} tokens", r.model.mtp_loss_weight_after,
                                                               count_text(static_cast<double>(r.model.mtp_loss_weight_until_tokens)))
                                                 : "");
  out += fmt::format("  FLOPs per token         {:.3g} (6 x active non-embedding parameters + attention at seq_len {}{})\n",
                     flops_per_token(r.model, r.data.seq_len), r.data.seq_len, r.model.mtp_depth > 0 ? ", MTP included" : "");
  out += fmt::format("  precision, ZeRO         {}, stage {}{}\n", name(r.precision.dtype), r.zero.stage,
                     param_shard_on_host(r)                            ? ", optimizer and parameter shards offloaded to CPU"
                     : r.zero.offload_optimizer == OffloadDevice::kCpu ? ", optimizer offloaded to CPU"
                                                                       : "");
  if (r.moe.expert_parallel_size > 1) out += expert_parallel_text(r);
  const bool pipelined = r.parallel.pipeline_parallel_size > 1;
  if (pipelined) out += pipeline_text(r, show_schedule);
  const MemoryPlan plan = memory_plan(r);
  out += fmt::format("  model states per rank   {} on the device{}{}\n", bytes_text(plan.device_states),
                     plan.host_states > 0 ? fmt::format(" + {} in host memory", bytes_text(plan.host_states)) : "",
                     pipelined ? " (the pipeline rank that needs the most memory)" : "");
  const char* recompute = r.train.activation_checkpointing == Recompute::kFull        ? "full recompute: each layer's input kept"
                          : r.train.activation_checkpointing == Recompute::kSelective ? "selective recompute: the GEMM outputs kept"
                                                                                      : "no recompute";
  out += fmt::format("  activations per rank    ~{} {} of {} x {} tokens (rough estimate, {}; logits {})\n",
                     bytes_text(plan.device_activations), pipelined ? "for the micro-batches the schedule holds, each" : "per micro-batch",
                     r.train.micro_batch_size, r.data.seq_len, recompute,
                     r.train.loss_chunk_tokens > 0 ? fmt::format("{} tokens at a time", r.train.loss_chunk_tokens) : "all at once");
  out += fmt::format(
      "  memory per rank         device {} = {} model states + {} activations{}; host {}\n", bytes_text(plan.device_total()),
      bytes_text(plan.device_states), bytes_text(plan.device_activations),
      plan.device_staging > 0 ? fmt::format(" + {} offload staging", bytes_text(plan.device_staging)) : "",
      plan.host_total() > 0
          ? fmt::format("{} = {} {} + {} pinned staging", bytes_text(plan.host_total()), bytes_text(plan.host_states),
                        param_shard_on_host(r) ? "optimizer states and parameters" : "optimizer states", bytes_text(plan.host_staging))
          : "none beyond the process");
  for (const double gib : {80.0, 141.0})
    out += fmt::format("  {:<24}{} (at most ~{} parameters at this shape, batch and mode)\n", fmt::format("on {:.0f} GiB GPUs", gib),
                       plan.device_total() <= 0.9 * gib * 1073741824.0 ? "fits" : "does not fit",
                       count_text(largest_model_fitting(r, gib * 1073741824.0)));
  return out;
}

std::string schema_markdown() {
  Recipe defaults;
  std::string out = "| key | default | meaning |\n|---|---|---|\n";
  for (const auto& f : recipe_schema()) {
    std::string meaning = f.help;
    if (!f.choices.empty()) meaning += fmt::format(" One of: {}.", fmt::join(f.choices, ", "));
    std::string deflt = value_text(f, defaults);
    if (f.path == "run_dir" || f.path == "data.path") deflt = "(required)";
    if (deflt == "0" && f.path.rfind("train.", 0) == 0) deflt = "(not set)";  // batch triple, steps/tokens: given or inferred
    out += fmt::format("| `{}` | {} | {} |\n", f.path, deflt, meaning);
  }
  return out;
}

}  // namespace dstrain::config
