#include "dstrain/metrics/step_metrics.h"

#include <string>

namespace dstrain::metrics {

std::vector<std::pair<std::string, double>> scalar_fields(const StepMetrics& m) {
  std::vector<std::pair<std::string, double>> fields = {{"loss", m.loss}};
  for (const ObjectiveMetric& o : m.objective)
    for (size_t k = 0; k < o.values.size(); ++k)
      fields.emplace_back(o.values.size() == 1 ? o.name : o.name + "_" + std::to_string(k + 1), o.values[k]);
  const std::vector<std::pair<std::string, double>> rest = {{"lr", m.lr},
                                                            {"grad_norm", m.grad_norm},
                                                            {"loss_scale", m.loss_scale},
                                                            {"skipped", m.skipped ? 1.0 : 0.0},
                                                            {"bad_steps", static_cast<double>(m.bad_steps)},
                                                            {"tokens", static_cast<double>(m.tokens)},
                                                            {"epoch", m.epoch},
                                                            {"accumulation", static_cast<double>(m.accumulation)},
                                                            {"step_ms", m.step_ms},
                                                            {"tokens_per_s", m.tokens_per_s},
                                                            {"samples_per_s", m.samples_per_s},
                                                            {"tflops_per_rank", m.tflops_per_rank},
                                                            {"mfu", m.mfu},
                                                            {"peak_tflops", m.peak_tflops},
                                                            {"data_wait_ms", m.data_wait_ms},
                                                            {"comm_wait_ms", m.comm_wait_ms},
                                                            {"host_rss_mb", m.host_rss_mb},
                                                            {"host_peak_rss_mb", m.host_peak_rss_mb},
                                                            {"device_alloc_peak_mb", m.device_alloc_peak_mb},
                                                            {"device_reserved_peak_mb", m.device_reserved_peak_mb},
                                                            {"expert_imbalance", m.expert_imbalance},
                                                            {"all_to_all_ms", m.all_to_all_ms},
                                                            {"pipeline_bubble", m.pipeline_bubble},
                                                            {"forward_ms", m.forward_ms},
                                                            {"backward_ms", m.backward_ms},
                                                            {"issue_ms", m.issue_ms},
                                                            {"reduce_ms", m.reduce_ms},
                                                            {"gather_ms", m.gather_ms},
                                                            {"optimizer_ms", m.optimizer_ms},
                                                            {"checkpoint_ms", m.checkpoint_ms}};
  fields.insert(fields.end(), rest.begin(), rest.end());
  return fields;
}

}  // namespace dstrain::metrics
