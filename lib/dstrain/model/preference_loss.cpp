#include "dstrain/model/preference_loss.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/chunked_cross_entropy.h"
#include "dstrain/model/objective.h"

namespace dstrain::model {

TermValue metric_term(const at::Tensor& sum, const at::Tensor& count) { return {sum.detach().to(at::kDouble), count.to(at::kDouble)}; }

at::Tensor pair_half(const at::Tensor& rows, int64_t which, int64_t pairs) {
  return rows.view({-1, 2}).select(1, which).narrow(0, 0, pairs);
}
namespace {

at::Tensor logsigmoid(const at::Tensor& x) { return at::log_sigmoid(x); }

struct PairTerms {
  at::Tensor logp_c, logp_r, ref_c, ref_r, tokens_c, tokens_r;  // float32 [pairs]
};

// One loss type's per-pair loss, as TRL 1.16 computes it (dpo_trainer.py, _compute_loss).
// f-DPO: f'(exp(log-ratio)) for the configured divergence (reverse_kl: the log-ratio itself).
at::Tensor divergence_score(const at::Tensor& logratio, const config::PreferenceConfig& c) {
  if (c.f_divergence_type == "forward_kl") return 1 - at::exp(-logratio);
  if (c.f_divergence_type == "js_divergence") return std::log(2.0) + logsigmoid(logratio);
  if (c.f_divergence_type == "alpha_divergence" && std::abs(c.f_alpha_divergence_coef - 1.0) >= 1e-6) {
    const double a = c.f_alpha_divergence_coef - 1.0;
    return (at::exp((a * logratio).clamp_max(80.0)) - 1.0) / a;  // clamped as TRL clamps float32
  }
  return logratio;
}

at::Tensor pair_loss(const std::string& type, const PairTerms& t, const config::PreferenceConfig& c) {
  const double beta = c.beta, eps = c.label_smoothing;
  const at::Tensor chosen_ratio = t.logp_c - t.ref_c, rejected_ratio = t.logp_r - t.ref_r;
  // The losses of the chosen-rejected difference take f-DPO's scores; the others the log-ratios
  // (the config refuses another divergence with them).
  const at::Tensor chosen = divergence_score(chosen_ratio, c), rejected = divergence_score(rejected_ratio, c);
  const at::Tensor delta = chosen - rejected;
  if (type == "sigmoid") {
    at::Tensor loss = -logsigmoid(beta * delta);
    return eps > 0 ? (1 - eps) * loss - eps * logsigmoid(-beta * delta) : loss;  // cDPO
  }
  if (type == "hinge") return at::relu(1 - beta * delta);
  if (type == "ipo" || type == "sigmoid_norm") {
    const at::Tensor d = chosen / t.tokens_c.clamp_min(1.0) - rejected / t.tokens_r.clamp_min(1.0);
    return type == "ipo" ? (d - 1 / (2 * beta)).pow(2) : -logsigmoid(beta * d);
  }
  if (type == "robust") return (-(1 - eps) * logsigmoid(beta * delta) + eps * logsigmoid(-beta * delta)) / (1 - 2 * eps);
  if (type == "exo_pair") {
    const at::Tensor z = beta * delta;
    return at::sigmoid(z) * (logsigmoid(z) - std::log1p(-eps)) + at::sigmoid(-z) * (logsigmoid(-z) - std::log(eps));
  }
  if (type == "nca_pair") return -logsigmoid(beta * chosen) - 0.5 * logsigmoid(-beta * chosen) - 0.5 * logsigmoid(-beta * rejected);
  if (type == "bco_pair") return -logsigmoid(beta * chosen) - logsigmoid(-beta * rejected);
  if (type == "sppo_hard") return (chosen - 0.5 / beta).pow(2) + (rejected + 0.5 / beta).pow(2);
  if (type == "apo_zero") return 1 - at::sigmoid(beta * chosen) + at::sigmoid(beta * rejected);
  if (type == "apo_down") return at::sigmoid(beta * chosen) + 1 - at::sigmoid(beta * delta);
  if (type == "aot" || type == "aot_unpaired") {  // AOT: the batch's log-ratio distributions matched by sorting them
    const at::Tensor z = type == "aot" ? std::get<0>(at::sort(t.logp_c - t.logp_r)) - std::get<0>(at::sort(t.ref_c - t.ref_r))
                                       : std::get<0>(at::sort(chosen_ratio)) - std::get<0>(at::sort(rejected_ratio));
    return -logsigmoid(beta * z) * (1 - eps) - logsigmoid(-beta * z) * eps;
  }
  if (type == "discopop") {  // the logistic loss blended into the exponential one as the margin grows
    const at::Tensor z = beta * delta, blend = at::sigmoid(z / c.discopop_tau);
    return -logsigmoid(z) * (1 - blend) + at::exp(-z) * blend;
  }
  throw Error(ErrorCode::kInternal, "preference.loss_type " + type + " reached the loss", "report this as a bug");
}

// LD-DPO's weight of each target: 1 within the first min(chosen, rejected) targets of its pair's
// completions, alpha after (TRL's shared and tail masks).
at::Tensor ld_weights(const at::Tensor& mask, double alpha) {
  if (mask.size(0) % 2 != 0)
    throw Error(ErrorCode::kInternal, fmt::format("a preference batch of {} rows", mask.size(0)), "report this as a bug");
  const at::Tensor position = mask.cumsum(-1);  // 1, 2, ... along each completion
  const at::Tensor shared = std::get<0>(mask.sum(-1).view({-1, 2}).min(1, true)).expand({-1, 2}).reshape({-1, 1});
  return at::where(position <= shared, at::ones_like(mask), at::full_like(mask, alpha)) * mask;
}

}  // namespace

RowLogps completion_logps(const CausalLM::Hidden& h, const data::Batch& batch, const CompletionOptions& options) {
  c10::NoGradGuard no_grad;
  const at::Tensor hidden = h.hidden.reshape({-1, h.hidden.size(-1)}), labels = batch.labels.reshape({-1});
  const int64_t n = hidden.size(0), chunk = options.chunk_tokens > 0 ? options.chunk_tokens : n;
  at::Tensor token = at::empty({n}, hidden.options().dtype(at::kFloat)), mean = at::empty_like(token);
  at::Tensor aligned = options.wpo ? at::empty_like(token) : at::Tensor();
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t count = std::min(chunk, n - first);
    const at::Tensor logits = at::matmul(hidden.narrow(0, first, count), h.head.t()).to(at::kFloat);
    const at::Tensor targets = labels.narrow(0, first, count);
    const at::Tensor logp = at::log_softmax(logits, -1).gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1);
    token.narrow(0, first, count).copy_(logp);
    mean.narrow(0, first, count).copy_(logits.mean(-1));
    // log sum_v p(v)^2 = logsumexp(2 logits) - 2 logsumexp(logits)
    if (options.wpo) aligned.narrow(0, first, count).copy_(logp - (at::logsumexp(2 * logits, -1) - 2 * at::logsumexp(logits, -1)));
  }
  const at::Tensor mask = (batch.labels != data::kIgnoreIndex).to(at::kFloat);
  RowLogps out;
  out.plain = (token.view_as(mask) * mask).sum(-1);
  out.mean_logits = (mean.view_as(mask) * mask).sum(-1);
  if (options.ld_alpha != 1.0) {
    out.token_weights = ld_weights(mask, options.ld_alpha);
    out.logps = (token.view_as(mask) * out.token_weights).sum(-1);
  } else {
    out.logps = out.plain;
  }
  if (options.wpo) out.wpo = (aligned.view_as(mask) * mask).sum(-1) / mask.sum(-1).clamp_min(1.0);
  return out;
}

const std::vector<std::string>& preference_metric_names() {
  static const std::vector<std::string> names = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                                                 "logps/chosen",   "logps/rejected",   "logits/chosen",      "logits/rejected"};
  return names;
}

ChosenTargets chosen_targets_counted(config::TrainObjective objective, const config::PreferenceConfig& c) {
  switch (objective) {
    case config::TrainObjective::kDpo:
      return std::find(c.loss_type.begin(), c.loss_type.end(), "sft") != c.loss_type.end() ? ChosenTargets::kCompletions
                                                                                           : ChosenTargets::kNone;
    case config::TrainObjective::kCpo:
    case config::TrainObjective::kSimpo:
      return ChosenTargets::kCompletions;  // the NLL is logged even at cpo_alpha 0
    case config::TrainObjective::kOrpo:
      return ChosenTargets::kSequences;
    case config::TrainObjective::kSft:
    case config::TrainObjective::kReward:
    case config::TrainObjective::kKto:
      break;
  }
  return ChosenTargets::kNone;
}

void set_preference_loss(Objective& objective, const config::PreferenceConfig& c) {
  std::vector<double> weights = c.loss_weights;
  if (weights.empty()) weights.assign(c.loss_type.size(), 1.0);
  const int64_t chunk = objective.chunk_tokens();
  objective.set_sequence_loss(preference_metric_names(), [c, weights, chunk](const CausalLM&, const CausalLM::Hidden& h,
                                                                             const data::Batch& batch) {
    if (!batch.reference_logps.defined() && batch.pairs > 0 && c.reference != "none")
      throw Error(ErrorCode::kInternal, "a preference batch without its reference log-probs", "report this as a bug");
    const RowLogps rows = completion_logps(h, batch, CompletionOptions{chunk, c.ld_alpha, c.use_weighting});
    const bool with_grad = c10::GradMode::is_enabled() && h.hidden.requires_grad();
    // The loss's graph starts at each row's sums: weighted (the log-ratios) and plain (sft's).
    const at::Tensor logps = rows.logps.clone().requires_grad_(with_grad), plain = rows.plain.clone().requires_grad_(with_grad);
    const at::Tensor tokens = (batch.labels != data::kIgnoreIndex).sum(-1).to(at::kFloat);
    const int64_t n = batch.pairs;
    const auto half = [n](const at::Tensor& x, int64_t which) { return pair_half(x, which, n); };
    const at::Tensor ref = batch.reference_logps.defined() ? batch.reference_logps.to(at::kFloat) : at::zeros_like(logps);
    PairTerms t{half(logps, 0), half(logps, 1), half(ref, 0), half(ref, 1), half(tokens, 0), half(tokens, 1)};
    // WPO: each pair weighs by both completions' length-normalized probabilities (no gradient).
    const at::Tensor pair_weight = c.use_weighting ? at::exp(half(rows.wpo, 0)) * at::exp(half(rows.wpo, 1)) : at::Tensor();
    at::Tensor loss = at::zeros({}, logps.options());
    for (size_t k = 0; k < c.loss_type.size(); ++k) {
      at::Tensor per_pair;
      if (c.loss_type[k] == "sft") {
        if (n > 0 && !(batch.chosen_targets_per_pair > 0))
          throw Error(ErrorCode::kInternal, "loss_type sft on a batch without the step's chosen targets", "report this as a bug");
        per_pair = -half(plain, 0) / (n > 0 ? batch.chosen_targets_per_pair : 1.0);
      } else {
        per_pair = pair_loss(c.loss_type[k], t, c);
      }
      if (pair_weight.defined()) per_pair = per_pair * pair_weight;
      loss = loss + per_pair.sum() * weights[k];
    }
    SequenceLossValue v;
    v.sum = loss.detach();
    if (with_grad) {  // d loss / d each row's sums, then the model's gradient through the chunked head
      const std::vector<at::Tensor> g = torch::autograd::grad({loss}, {logps, plain}, {}, false, false, true);
      const at::Tensor g_weighted = g[0].defined() ? g[0] : at::zeros_like(logps), g_plain = g[1].defined() ? g[1] : at::zeros_like(plain);
      at::Tensor per_token = g_weighted.unsqueeze(-1).expand_as(batch.labels).to(at::kFloat);
      if (rows.token_weights.defined()) per_token = per_token * rows.token_weights;
      per_token = (-(per_token + g_plain.unsqueeze(-1))).reshape({-1}).contiguous();
      const at::Tensor surrogate =
          chunked_linear_cross_entropy(h.hidden.reshape({-1, h.hidden.size(-1)}), h.head, batch.labels.reshape({-1}),
                                       chunk > 0 ? chunk : batch.labels.numel(), data::kIgnoreIndex, per_token);
      v.sum = v.sum + (surrogate - surrogate.detach()).to(v.sum.scalar_type());
    }
    const at::Tensor logp_c = t.logp_c.detach(), logp_r = t.logp_r.detach();
    const at::Tensor rc = c.beta * (logp_c - t.ref_c), rr = c.beta * (logp_r - t.ref_r);
    const at::Tensor pairs = at::full({}, static_cast<double>(n), at::TensorOptions().dtype(at::kDouble).device(logps.device()));
    v.metrics = {metric_term(rc.sum(), pairs),
                 metric_term(rr.sum(), pairs),
                 metric_term((rc > rr).sum(), pairs),
                 metric_term((rc - rr).sum(), pairs),
                 metric_term(logp_c.sum(), pairs),
                 metric_term(logp_r.sum(), pairs),
                 metric_term(half(rows.mean_logits, 0).sum(), t.tokens_c.sum()),
                 metric_term(half(rows.mean_logits, 1).sum(), t.tokens_r.sum())};
    return v;
  });
}

}  // namespace dstrain::model
