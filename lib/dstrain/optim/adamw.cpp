#include "dstrain/optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace dstrain::optim {

AdamW::AdamW(const model::NamedTensors& params, AdamWConfig config) : params_(params), config_(config) {
  for (const auto& p : params_) {
    exp_avg_.push_back({"exp_avg." + p.name, at::zeros_like(p.tensor)});
    exp_avg_sq_.push_back({"exp_avg_sq." + p.name, at::zeros_like(p.tensor)});
  }
}

void AdamW::step(double lr) {
  c10::NoGradGuard no_grad;
  ++steps_;
  const double bias1 = 1.0 - std::pow(config_.beta1, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(config_.beta2, static_cast<double>(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].tensor;
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!config_.decoupled && config_.weight_decay != 0) g = g.add(p, config_.weight_decay);
    at::Tensor m = exp_avg_[i].tensor, v = exp_avg_sq_[i].tensor;
    m.mul_(config_.beta1).add_(g, 1.0 - config_.beta1);
    v.mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
    if (config_.decoupled) p.mul_(1.0 - lr * config_.weight_decay);
    const at::Tensor denom = (v / bias2).sqrt_().add_(config_.eps);
    p.addcdiv_(m, denom, -lr / bias1);
  }
}

model::NamedTensors AdamW::state() const {
  model::NamedTensors out = exp_avg_;
  out.insert(out.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
  return out;
}

double clip_grad_norm(const model::NamedTensors& params, double max_norm) {
  c10::NoGradGuard no_grad;
  double sum_sq = 0.0;
  for (const auto& p : params)
    if (p.tensor.grad().defined()) sum_sq += p.tensor.grad().to(at::kDouble).pow(2).sum().item<double>();
  const double norm = std::sqrt(sum_sq);
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params)
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().mul_(scale);
  }
  return norm;
}

}  // namespace dstrain::optim
