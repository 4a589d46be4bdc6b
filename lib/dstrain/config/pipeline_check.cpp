#include "dstrain/config/pipeline_check.h"

#include <fmt/format.h>

#include <cmath>

#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/stage_split.h"

namespace dstrain::config {

namespace {

bool set_by_user(const Recipe& r, const std::string& key) {
  const auto it = r.sources.find(key);
  return it != r.sources.end() && it->second != "default";
}

}  // namespace

std::string pipeline_world_problem(const Recipe& r) {
  const int64_t p = r.parallel.pipeline_parallel_size;
  if (p <= 1 || r.world_size() % p == 0) return "";
  return fmt::format(
      "parallel.pipeline_parallel_size {} does not divide the world size {} ({} node(s) x {} per node): every stage "
      "needs as many data-parallel ranks",
      p, r.world_size(), r.launch.nnodes, r.launch.nproc_per_node);
}

std::vector<int64_t> micro_batches_per_step(const Recipe& r) {
  std::vector<int64_t> out;
  for (const auto& stage : r.train.accumulation) out.push_back(stage.steps);
  if (out.empty()) out.push_back(r.train.gradient_accumulation_steps);
  return out;
}

std::vector<int> given_split(const Recipe& r) {
  std::vector<int> counts;
  for (double n : r.pipeline.layers_per_stage) counts.push_back(static_cast<int>(n));
  return counts;
}

void check_pipeline(const Recipe& r, const std::function<void(const std::string&)>& problem,
                    const std::function<void(const std::string&)>& warn) {
  const int64_t p = r.parallel.pipeline_parallel_size, v = r.pipeline.virtual_stages;
  if (p == 1) {
    for (const char* key : {"pipeline.schedule", "pipeline.virtual_stages", "pipeline.layers_per_stage"})
      if (set_by_user(r, key))
        warn(fmt::format("{} ({}) has no effect without pipeline parallelism (parallel.pipeline_parallel_size is 1)", key,
                         r.sources.at(key)));
    return;
  }
  // Not built with a pipeline yet: each names its key.
  if (!r.data.shard_weights.empty() || r.data.auto_balance)
    problem(
        fmt::format("data.shard_weights ({}) with parallel.pipeline_parallel_size {}: every stage of a pipeline must read the same "
                    "micro-batches, and uneven shares are not planned per pipeline yet; remove data.shard_weights",
                    r.sources.count("data.shard_weights") ? r.sources.at("data.shard_weights") : "set", p));
  if (set_by_user(r, "zero.overlap_comm") && r.zero.overlap_comm)
    warn(
        fmt::format("zero.overlap_comm ({}) has no effect with pipeline parallelism: each stage gathers its parameters (ZeRO-3) "
                    "and reduces its gradients once per step, at the step's boundaries",
                    r.sources.at("zero.overlap_comm")));
  if (const std::string world = pipeline_world_problem(r); !world.empty()) return problem(world);
  const int64_t stages = p * v;
  if (r.model.num_layers < stages)
    problem(
        fmt::format("parallel.pipeline_parallel_size {} x pipeline.virtual_stages {} = {} stages, but model.num_layers is {}: every "
                    "stage needs a decoder layer; lower one of them",
                    p, v, stages, r.model.num_layers));
  if (!r.pipeline.layers_per_stage.empty()) {
    bool whole = true;
    for (double n : r.pipeline.layers_per_stage) whole = whole && n == std::floor(n);
    const std::string split = whole
                                  ? pipeline::split_problem(given_split(r), static_cast<int>(r.model.num_layers), static_cast<int>(stages))
                                  : "must hold whole numbers of layers";
    if (!split.empty()) problem(fmt::format("pipeline.layers_per_stage ({}) {}", r.sources.at("pipeline.layers_per_stage"), split));
  }
  const std::string& schedule = name(r.pipeline.schedule);
  const std::string virtual_rule = pipeline::schedule_rule_problem(r.pipeline.schedule, static_cast<int>(p), static_cast<int>(v), 1 << 20);
  if (!virtual_rule.empty()) {
    problem(fmt::format("pipeline.virtual_stages {} with pipeline.schedule {}: {}", v, schedule, virtual_rule));
    return;
  }
  for (const int64_t m : micro_batches_per_step(r)) {
    const std::string rule =
        pipeline::schedule_rule_problem(r.pipeline.schedule, static_cast<int>(p), static_cast<int>(v), static_cast<int>(m));
    if (rule.empty()) continue;
    problem(
        fmt::format("train.gradient_accumulation_steps {} is the micro-batches per step of each pipeline (pipeline.schedule {}, "
                    "parallel.pipeline_parallel_size {}): {}; raise it to at least {} (a larger train.global_batch_size or a smaller "
                    "train.micro_batch_size), or --set pipeline.schedule=gpipe",
                    m, schedule, p, rule, p));
    break;
  }
}

}  // namespace dstrain::config
