#include "dstrain/model/kto_loss.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/chunked_cross_entropy.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"

namespace dstrain::model {
namespace {

// Each example's loss before its weight (TRL's kto and apo_zero_unpaired).
at::Tensor example_losses(const std::string& type, const at::Tensor& logratio, const at::Tensor& desirable, const at::Tensor& kl,
                          double beta) {
  if (type == "apo_zero_unpaired") return at::where(desirable, 1 - at::sigmoid(beta * logratio), at::sigmoid(beta * logratio));
  return at::where(desirable, 1 - at::sigmoid(beta * (logratio - kl)), 1 - at::sigmoid(beta * (kl - logratio)));
}

}  // namespace

const std::vector<std::string>& kto_metric_names() {
  static const std::vector<std::string> names = {"kl",           "rewards/chosen", "rewards/rejected", "rewards/margins",
                                                 "logps/chosen", "logps/rejected", "logits/chosen",    "logits/rejected"};
  return names;
}

void set_kto_loss(Objective& objective, const config::PreferenceConfig& c) {
  const int64_t chunk = objective.chunk_tokens();
  const std::string type = c.loss_type.at(0);
  objective.set_sequence_loss(kto_metric_names(), [c, chunk, type](const CausalLM&, const CausalLM::Hidden& h, const data::Batch& batch) {
    const int64_t n = batch.pairs;
    if (n > 0 && ((!batch.reference_logps.defined() && c.reference != "none") || !batch.desirable.defined()))
      throw Error(ErrorCode::kInternal, "a KTO batch without its reference log-probs or labels", "report this as a bug");
    const RowLogps rows = completion_logps(h, batch, chunk);
    const bool with_grad = c10::GradMode::is_enabled() && h.hidden.requires_grad();
    const at::Tensor logps = rows.logps.clone().requires_grad_(with_grad);
    const at::Tensor ref = batch.reference_logps.defined() ? batch.reference_logps.to(logps.device(), at::kFloat) : at::zeros_like(logps);
    const at::Tensor desirable =
        batch.desirable.defined() ? batch.desirable.to(logps.device()).narrow(0, 0, n) : at::zeros({n}, logps.options().dtype(at::kBool));
    const at::Tensor logratio = pair_half(logps, 0, n) - pair_half(ref, 0, n);
    // The KL estimate: the KL rows' log-ratios (no gradient, as TRL computes them), clamped at 0.
    at::Tensor kl = at::zeros({}, logps.options());
    if (type == "kto" && n > 0) kl = (pair_half(rows.logps, 1, n) - pair_half(ref, 1, n)).mean().clamp_min(0);
    const at::Tensor weight =
        at::where(desirable, at::full({}, c.desirable_weight, logps.options()), at::full({}, c.undesirable_weight, logps.options()));
    const at::Tensor loss = (example_losses(type, logratio, desirable, kl, c.beta) * weight).sum();
    SequenceLossValue v;
    v.sum = loss.detach();
    if (with_grad) {  // d loss / d each example's sum, then the model's gradient through the chunked head
      const at::Tensor g = torch::autograd::grad({loss}, {logps}, {}, false, false, true)[0];
      const at::Tensor per_token = (-(g.defined() ? g : at::zeros_like(logps))).unsqueeze(-1).expand_as(batch.labels).to(at::kFloat);
      const at::Tensor surrogate =
          chunked_linear_cross_entropy(h.hidden.reshape({-1, h.hidden.size(-1)}), h.head, batch.labels.reshape({-1}),
                                       chunk > 0 ? chunk : batch.labels.numel(), data::kIgnoreIndex, per_token.reshape({-1}).contiguous());
      v.sum = v.sum + (surrogate - surrogate.detach()).to(v.sum.scalar_type());
    }
    const at::Tensor chosen = desirable.to(at::kFloat), rejected = 1 - chosen;
    const at::Tensor rewards = c.beta * logratio.detach(), logp = pair_half(rows.logps, 0, n);
    const at::Tensor n_chosen = chosen.sum(), n_rejected = rejected.sum();
    const at::Tensor tokens = pair_half((batch.labels != data::kIgnoreIndex).sum(-1).to(at::kFloat).to(logps.device()), 0, n);
    const at::Tensor mean_logits = pair_half(rows.mean_logits, 0, n);
    const at::Tensor both = (n_chosen > 0) & (n_rejected > 0);
    const at::Tensor margin =
        at::where(both, (rewards * chosen).sum() / n_chosen.clamp_min(1) - (rewards * rejected).sum() / n_rejected.clamp_min(1),
                  at::zeros({}, logps.options()));
    const at::Tensor micro_batch = at::full({}, n > 0 ? 1.0 : 0.0, logps.options());
    v.metrics = {metric_term(kl * micro_batch, micro_batch),
                 metric_term((rewards * chosen).sum(), n_chosen),
                 metric_term((rewards * rejected).sum(), n_rejected),
                 metric_term(margin, both.to(at::kFloat)),
                 metric_term((logp * chosen).sum(), n_chosen),
                 metric_term((logp * rejected).sum(), n_rejected),
                 metric_term((mean_logits * chosen).sum(), (tokens * chosen).sum()),
                 metric_term((mean_logits * rejected).sum(), (tokens * rejected).sum())};
    return v;
  });
}

}  // namespace dstrain::model
