#pragma once
// AdamW (decoupled weight decay, bias-corrected), or Adam with L2 decay,, over a list of fp32 parameters. Its state is
// plain named tensors so that checkpoints store it like any other tensor.
#include <cstdint>

#include "dstrain/model/named_tensor.h"

namespace dstrain::optim {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = true;  // AdamW; false: Adam with L2 decay added to the gradient
};

class AdamW {
 public:
  AdamW(const model::NamedTensors& params, AdamWConfig config);
  // One update with learning rate `lr` from the parameters' .grad(); counts the step.
  void step(double lr);
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  // exp_avg.<name> and exp_avg_sq.<name> for every parameter, in parameter order.
  model::NamedTensors state() const;

 private:
  model::NamedTensors params_;
  model::NamedTensors exp_avg_, exp_avg_sq_;
  AdamWConfig config_;
  int64_t steps_ = 0;
};

// Scales all gradients so that their global L2 norm is at most max_norm; returns the norm
// before clipping. max_norm <= 0 only measures.
double clip_grad_norm(const model::NamedTensors& params, double max_norm);

}  // namespace dstrain::optim
