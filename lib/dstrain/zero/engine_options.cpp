#include "dstrain/config/recipe.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/model/lora.h"
#include "dstrain/zero/engine.h"

namespace dstrain::zero {

EngineOptions options_from(const config::Recipe& r, const at::Device& device) {
  EngineOptions o;
  o.device = device;
  o.offload_chunk = FaultInjector::get().offload_chunk(o.offload_chunk);  // tests use many small chunks
  o.stage = static_cast<int>(r.zero.stage);
  o.reduce_bucket_size = r.zero.reduce_bucket_size;
  // Pipeline parallelism: the stages' micro-batches interleave, so the engine communicates at the
  // step's boundaries only (config::check_pipeline says that zero.overlap_comm has no effect).
  o.step_boundary_comm = r.parallel.pipeline_parallel_size > 1;
  o.overlap_comm = r.zero.overlap_comm && !o.step_boundary_comm;
  o.offload_optimizer = r.zero.offload_optimizer == config::OffloadDevice::kCpu;
  o.offload_param = r.zero.offload_param == config::OffloadDevice::kCpu && r.zero.stage == 3;
  o.pin_memory = r.zero.pin_memory;
  o.delayed_update = o.offload_optimizer && r.zero.delayed_update;
  o.delayed_update_after = r.zero.delayed_update_after;
  o.prefetch_bucket_size = r.zero.stage3_prefetch_bucket_size;
  o.persistence_threshold = r.zero.stage3_param_persistence_threshold;
  o.dtype = r.precision.dtype;
  o.adam = {r.optimizer.lr,
            r.optimizer.beta1,
            r.optimizer.beta2,
            r.optimizer.eps,
            r.optimizer.weight_decay,
            r.optimizer.type == config::OptimizerType::kAdamW,
            1};
  o.grad_clip = r.train.grad_clip;
  o.checkpoint_frozen = !model::lora_checkpoints_name_base(r);
  o.average_over_ranks = false;  // each rank's loss is already divided by the global token count
  const auto& p = r.precision;
  o.loss_scaler = {p.loss_scale, p.initial_scale_power,    p.loss_scale_window,
                   p.hysteresis, p.consecutive_hysteresis, static_cast<double>(p.min_loss_scale)};
  return o;
}

}  // namespace dstrain::zero
