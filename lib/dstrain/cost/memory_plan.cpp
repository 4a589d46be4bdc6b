#include "dstrain/cost/memory_plan.h"

#include <algorithm>

#include "dstrain/cost/model_costs.h"
#include "dstrain/cost/pipeline_plan.h"

namespace dstrain::cost {

using namespace config;

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

}  // namespace dstrain::cost
