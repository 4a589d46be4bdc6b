#include "dstrain/cost/dry_run.h"

#include "dstrain/config/reference_mode.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "dstrain/config/schema.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/cost/pipeline_plan.h"

namespace dstrain::cost {

using namespace config;

namespace {
// train.freeze or lora: what trains, what does not, and the model states it saves per rank.
std::string frozen_text(const Recipe& r) {
  const int last = static_cast<int>(r.model.num_layers) + 1;
  const double adapters = r.frozen.adapters_in(0, last) + r.frozen.routed_adapters_in(0, last);
  const double total = static_cast<double>(parameter_counts(r.model).total) + adapters;
  const double frozen = r.frozen.in_groups(0, last, false) + r.frozen.in_groups(0, last, true);
  Recipe unfrozen = r;
  unfrozen.frozen = {};
  const MemoryPlan with = memory_plan(r), without = memory_plan(unfrozen);
  const double saved = (without.device_states + without.host_states) - (with.device_states + with.host_states);
  std::string out;
  if (r.lora.enabled()) {
    const double scale = r.lora.use_rslora ? r.lora.alpha / std::sqrt(static_cast<double>(r.lora.rank)) : r.lora.alpha / r.lora.rank;
    const size_t patterns = r.lora.rank_pattern.size() + r.lora.alpha_pattern.size();
    out = fmt::format(
        "  lora                    rank {}, alpha {:g} (scale {:g}{}{}) on [{}]{}{}: {} adapter parameters{}; the rest of the base (norms, "
        "MoE routers and their bias{}) frozen\n",
        r.lora.rank, r.lora.alpha, scale, r.lora.use_dora ? ", DoRA" : "",
        r.lora.dropout > 0 ? fmt::format(", dropout {:g}", r.lora.dropout) : "", fmt::join(r.lora.targets, ", "),
        r.lora.experts ? fmt::format(" and the routed experts ({} of them)", count_text(r.frozen.routed_adapters_in(0, last))) : "",
        patterns > 0 ? fmt::format(", {} rank/alpha pattern{}", patterns, patterns == 1 ? "" : "s") : "", count_text(adapters),
        r.lora.modules_to_save.empty() ? "" : fmt::format(", [{}] trained in full", fmt::join(r.lora.modules_to_save, ", ")),
        r.lora.experts ? "" : ", routed experts");
  }
  if (r.lora.enabled() && r.lora.base != LoraBase::kModel) {
    // What the frozen projections take in their storage, per rank: a rank holds its stages' and its experts' whole.
    const double ep = static_cast<double>(r.moe.expert_parallel_size), pp = static_cast<double>(r.parallel.pipeline_parallel_size);
    const double dense = r.frozen.quantized_in(0, last, false), routed = r.frozen.quantized_in(0, last, true);
    Recipe in_dtype = r;
    in_dtype.lora.base = LoraBase::kModel;
    out += fmt::format(
        "  {:<23} {} of the frozen projections' weights in {}: {} ({} in {}); per rank about {} (each data-parallel rank "
        "holds its stages' and experts' whole)\n",
        "lora base", count_text(dense + routed), r.lora.base == LoraBase::kNf4 ? "NF4 (double quantization)" : "FP8 blocks",
        bytes_text((dense + routed) * lora_base_bytes_per_element(r)), bytes_text((dense + routed) * lora_base_bytes_per_element(in_dtype)),
        config::name(r.precision.dtype), bytes_text((dense / pp + routed / (ep * pp)) * lora_base_bytes_per_element(r)));
  }
  return out +
         fmt::format(
             "  {:<23} {} parameters frozen ({:.1f}%; {} in {}), {} trainable; model states per rank {} instead of full training's {} "
             "({})\n",
             r.lora.enabled() ? "frozen base" : "train.freeze", count_text(frozen), 100.0 * frozen / std::max(total, 1.0),
             bytes_text(frozen * (r.precision.dtype == config::Dtype::kFp32 ? 4.0 : 2.0)), config::name(r.precision.dtype),
             count_text(total - frozen), bytes_text(with.device_states + with.host_states),
             bytes_text(without.device_states + without.host_states),
             saved >= 0 ? fmt::format("saves {}: no gradients, fp32 master or Adam states for the frozen ones{}", bytes_text(saved),
                                      r.lora.enabled() && r.lora.base != LoraBase::kModel ? ", the projections quantized" : "")
                        : fmt::format("{} more: the adapters' states outweigh what the frozen base saves", bytes_text(-saved)));
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
  if (starts_with(path, "lora.")) return r.lora.enabled();
  if (starts_with(path, "preference.") || path == "train.objective") return r.train.trains_pairs();
  if (path == "model.score_head") return r.model.score_head;
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
  if (path == "parallel.sequence_parallel_size") return r.parallel.sequence_parallel_size > 1;
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
  if (r.parallel.sequence_parallel_size > 1)
    out += fmt::format("  sequence parallelism    {} ranks share each sample, {} of its {} tokens each (Ulysses); {} distinct rows\n",
                       r.parallel.sequence_parallel_size, r.data.seq_len / r.parallel.sequence_parallel_size, r.data.seq_len,
                       r.data_parallel_size() == 1 ? std::string("1 rank reads") : fmt::format("{} ranks read", r.data_parallel_size()));
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
                     pipelined                         ? " (the pipeline rank that needs the most memory)"
                     : config::keeps_reference_copy(r) ? " (the frozen reference copy of preference.reference live included)"
                                                       : "");
  const char* recompute = r.train.activation_checkpointing == Recompute::kFull        ? "full recompute: each layer's input kept"
                          : r.train.activation_checkpointing == Recompute::kSelective ? "selective recompute: the GEMM outputs kept"
                                                                                      : "no recompute";
  out += fmt::format("  activations per rank    ~{} {} of {} x {} tokens (rough estimate, {}; logits {})\n",
                     bytes_text(plan.device_activations), pipelined ? "for the micro-batches the schedule holds, each" : "per micro-batch",
                     r.train.micro_batch_size, r.data.seq_len, recompute,
                     r.train.loss_chunk_tokens > 0 ? fmt::format("{} tokens at a time", r.train.loss_chunk_tokens) : "all at once");
  if (r.parallel.sequence_parallel_size > 1) {
    config::Recipe whole = r;
    whole.parallel.sequence_parallel_size = 1;
    const double unsharded = memory_plan(whole).device_activations;
    out += fmt::format("                          ~{} without sequence parallelism ({:.2f}x)\n", bytes_text(unsharded),
                       plan.device_activations / std::max(unsharded, 1.0));
  }
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

}  // namespace dstrain::cost
