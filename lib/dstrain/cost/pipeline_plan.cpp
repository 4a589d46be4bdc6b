#include "dstrain/cost/pipeline_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dstrain/config/pipeline_check.h"
#include "dstrain/pipeline/validate.h"

namespace dstrain::cost {

using namespace config;

std::vector<int> stage_layers(const Recipe& r) {
  const int stages = static_cast<int>(r.parallel.pipeline_parallel_size * r.pipeline.virtual_stages);
  if (!r.pipeline.layers_per_stage.empty()) return given_split(r);
  return pipeline::balanced_split(layer_costs(r.model, r.data.seq_len), stages);
}

PipelinePlan pipeline_plan(const Recipe& r) {
  const int p = static_cast<int>(r.parallel.pipeline_parallel_size), v = static_cast<int>(r.pipeline.virtual_stages);
  const ModelConfig& m = r.model;
  const double embedding = static_cast<double>(m.vocab_size * m.hidden_size),
               head = static_cast<double>((head_rows(m) + 1) * m.hidden_size);
  const pipeline::LayerCosts costs = layer_costs(m, r.data.seq_len);
  const ParameterCounts mtp = mtp_module_counts(m);  // on the last stage
  PipelinePlan plan;
  int layer = 0;
  const std::vector<int> counts = stage_layers(r);
  for (size_t s = 0; s < counts.size(); ++s) {
    StagePlan st;
    st.first_layer = layer, st.layers = counts[s];
    st.embedding = s == 0, st.head = s + 1 == counts.size(), st.mtp = st.head && m.mtp_depth > 0;
    for (int i = 0; i < counts[s]; ++i, ++layer) {
      const ParameterCounts c = decoder_layer_counts(m, layer);
      st.parameters += static_cast<double>(c.total), st.routed += static_cast<double>(c.routed);
      st.flops_per_token += costs.layers[static_cast<size_t>(layer)];
    }
    if (st.embedding) st.parameters += embedding;
    if (st.head)
      st.parameters += head + static_cast<double>(mtp.total), st.routed += static_cast<double>(mtp.routed),
          st.flops_per_token += costs.head;
    plan.stages.push_back(st);
  }
  plan.schedule = pipeline::build_schedule(r.pipeline.schedule, p, v, static_cast<int>(micro_batches_per_step(r).front()));
  plan.timeline = pipeline::simulate(plan.schedule, pipeline::Costs{});
  const ActivationParts act = activation_parts(r);
  // With MTP every stage's input carries the embeddings' output too: one more [B, T, H] per held
  // micro-batch; the last stage holds its MTP blocks' activations and computes D more losses.
  const double depths = static_cast<double>(m.mtp_depth), elem = r.precision.dtype == Dtype::kFp32 ? 4.0 : 2.0;
  const double carried = m.mtp_depth > 0 ? static_cast<double>(r.train.micro_batch_size * r.data.seq_len * m.hidden_size) * elem : 0.0;
  const double ep = static_cast<double>(r.moe.expert_parallel_size), dp = static_cast<double>(r.data_parallel_size());
  for (int rank = 0; rank < p; ++rank) {
    PipelineRankPlan rp;
    double dense = 0, experts = 0, layers = 0, frozen_dense = 0, frozen_experts = 0, quantized_dense = 0, quantized_experts = 0;
    bool holds_head = false;
    for (int s = rank; s < p * v; s += p) {
      const StagePlan& st = plan.stages[static_cast<size_t>(s)];
      rp.stages.push_back(s);
      dense += st.parameters - st.routed, experts += st.routed / ep, layers += st.layers;
      // Its layer groups (0 the embeddings, 1..L the layers, L+1 the head): what train.freeze or lora froze there.
      const int first = st.embedding ? 0 : st.first_layer + 1,
                last = st.head ? static_cast<int>(m.num_layers) + 1 : st.first_layer + st.layers;
      frozen_dense += r.frozen.in_groups(first, last, false), frozen_experts += r.frozen.in_groups(first, last, true) / ep;
      quantized_dense += r.frozen.quantized_in(first, last, false), quantized_experts += r.frozen.quantized_in(first, last, true) / ep;
      dense += r.frozen.adapters_in(first, last);  // lora's adapters there
      experts += r.frozen.routed_adapters_in(first, last) / ep;
      rp.flops_per_token += st.flops_per_token, holds_head = holds_head || st.head;
    }
    rp.parameters = dense + experts;
    const ModelStateMemory states =
        model_state_bytes(r, dense, dp, experts, dp / ep, frozen_dense, frozen_experts, quantized_dense, quantized_experts);
    rp.device_states = states.device_bytes, rp.host_states = states.host_bytes;
    rp.peak_micro_batches = plan.timeline.peak_held[static_cast<size_t>(rank)];
    rp.activations = rp.peak_micro_batches * ((layers / v) * act.per_layer + carried) + act.working;
    if (holds_head) rp.activations += (rp.peak_micro_batches / v) * depths * act.per_layer + act.loss * (1.0 + depths);
    plan.ranks.push_back(rp);
  }
  return plan;
}

namespace {

std::string span_text(int64_t first, int64_t last) { return first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last); }

std::string stage_table(const PipelinePlan& plan) {
  std::string out = "  stage  layers         parameters  FLOPs/token\n";
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& st = plan.stages[s];
    const std::string layers = span_text(st.first_layer, st.first_layer + st.layers - 1) + (st.embedding ? " +emb" : "") +
                               (st.head ? " +head" : "") + (st.mtp ? "+mtp" : "");
    out += fmt::format("  {:>5}  {:<14} {:>10}  {:>11.3g}\n", s, layers, count_text(st.parameters), st.flops_per_token);
  }
  return out;
}

std::string rank_table(const Recipe& r, const PipelinePlan& plan) {
  const int64_t dp = r.data_parallel_size(), per_node = r.launch.nproc_per_node;
  std::string out =
      "  pipeline rank  global ranks  nodes    stages      parameters  states      activations (micro-batches)  device total\n";
  for (size_t rank = 0; rank < plan.ranks.size(); ++rank) {
    const PipelineRankPlan& rp = plan.ranks[rank];
    const ParallelLayout layout = r.layout();
    const int64_t first = layout.rank_of(static_cast<int>(rank), 0),
                  last = layout.rank_of(static_cast<int>(rank), static_cast<int>(dp) - 1);
    out +=
        fmt::format("  {:>13}  {:<12}  {:<7}  {:<10}  {:>10}  {:<10}  {:<10} ({:>3})             {}\n", rank, span_text(first, last),
                    span_text(first / per_node, last / per_node), fmt::format("{}", fmt::join(rp.stages, ",")), count_text(rp.parameters),
                    bytes_text(rp.device_states), bytes_text(rp.activations), rp.peak_micro_batches, bytes_text(rp.device_total()));
  }
  return out;
}

}  // namespace

std::string pipeline_text(const Recipe& r, bool show_schedule) {
  const PipelinePlan plan = pipeline_plan(r);
  const int64_t p = r.parallel.pipeline_parallel_size, dp = r.data_parallel_size();
  const int64_t per_node = r.launch.nproc_per_node;
  std::string out = fmt::format(
      "  pipeline                {} pipeline ranks x {} stage(s) each ({} stages, {}), {} data-parallel rank(s) per stage: pipeline rank "
      "k is global ranks k x {} .. k x {} + {} (stage-major: a stage's data-parallel{} group{})\n",
      p, r.pipeline.virtual_stages, plan.stages.size(),
      r.pipeline.layers_per_stage.empty() ? "split by training FLOPs" : "pipeline.layers_per_stage", dp, dp, dp, dp - 1,
      r.moe.expert_parallel_size > 1 ? " and expert-parallel" : "",
      dp <= per_node && per_node % dp == 0 ? " stays inside a node" : " spans nodes (more data-parallel ranks than GPUs per node)");
  out += stage_table(plan);
  std::vector<double> rank_flops;
  for (const auto& rp : plan.ranks) rank_flops.push_back(rp.flops_per_token);
  const double mean = std::accumulate(rank_flops.begin(), rank_flops.end(), 0.0) / static_cast<double>(rank_flops.size());
  const double slowest = *std::max_element(rank_flops.begin(), rank_flops.end());
  out += fmt::format(
      "  schedule                {}, {} micro-batches per step: bubble {:.3f} of the compute (replayed with F = I = W; the papers' "
      "{:.3f}); the slowest pipeline rank computes {:.1f}% more than the mean, and a step runs at its pace\n",
      name(r.pipeline.schedule), plan.schedule.micro_batches, plan.timeline.bubble(),
      pipeline::bubble_formula(plan.schedule, pipeline::Costs{}), 100.0 * (slowest / mean - 1.0));
  out += rank_table(r, plan);
  if (show_schedule) {
    out += fmt::format(
        "schedule {} (F forward, B backward, I input gradient, W weight gradient, SF/RF send/receive activations, "
        "SB/RB send/receive gradients; STAGE.MICRO_BATCH, >to <from):\n",
        name(r.pipeline.schedule));
    out += pipeline::schedule_text(plan.schedule);
    const auto problems = pipeline::validate(plan.schedule);
    out += problems.empty() ? "validated: every receive has its send, every dependency holds, no rank waits forever\n"
                            : "INVALID: " + problems.front() + "\n";
    out += "replay at F = I = W = 1 (upper case even micro-batches, lower case odd, '.' idle):\n";
    out += pipeline::timeline_chart(plan.timeline, 1.0 / static_cast<double>(r.pipeline.virtual_stages));
  }
  return out;
}

}  // namespace dstrain::cost
