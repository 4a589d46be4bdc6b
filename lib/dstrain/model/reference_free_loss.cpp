#include "dstrain/model/reference_free_loss.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/model/chunked_cross_entropy.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"

namespace dstrain::model {
namespace {

using config::TrainObjective;

// log(1 - e^x) for x < 0, as TRL's log1mexp: the branch at -ln 2 avoids cancellation.
at::Tensor log1mexp(const at::Tensor& x) { return at::where(x < -std::log(2.0), at::log1p(-at::exp(x)), at::log(-at::expm1(x))); }

// The chosen rows' every target, prompt included (ORPO's NLL): a row holds one sequence from
// position 0, so each position before its last trained target predicts the next token. Rejected
// rows keep their completion's labels.
at::Tensor sequence_labels(const data::Batch& batch) {
  const at::Tensor trained = batch.labels != data::kIgnoreIndex;
  const int64_t T = batch.labels.size(1);
  const at::Tensor positions = at::arange(T, batch.labels.options()).expand_as(batch.labels);
  const at::Tensor last = at::where(trained, positions, at::full_like(positions, -1)).amax(1, true);
  const at::Tensor next = at::roll(batch.tokens.to(batch.labels.device()), -1, 1);
  at::Tensor whole = at::where(trained, batch.labels, at::where(positions < last, next, at::full_like(next, data::kIgnoreIndex)));
  const at::Tensor chosen_row = (at::arange(batch.labels.size(0), batch.labels.options()) % 2 == 0).unsqueeze(1);
  return at::where(chosen_row, whole, batch.labels);
}

struct Rewards {
  at::Tensor per_pair, chosen, rejected;  // the pairs' losses; r of each half (before beta)
  at::Tensor log_odds;                    // orpo's
};

Rewards cpo_losses(const at::Tensor& lc, const at::Tensor& lr, const std::string& type, const config::PreferenceConfig& c) {
  const double a = c.alpha, beta = c.beta, eps = c.label_smoothing;
  Rewards out;
  out.chosen = a != 0 ? (1 - at::exp(-a * lc)) / a : lc;  // AlphaPO: (1 - p^-alpha) / alpha
  out.rejected = a != 0 ? (1 - at::exp(-a * lr)) / a : lr;
  at::Tensor d = out.chosen - out.rejected;
  if (type == "simpo") d = d - c.simpo_gamma / beta;
  if (type == "sigmoid" || type == "simpo")
    out.per_pair = -at::log_sigmoid(beta * d) * (1 - eps) - at::log_sigmoid(-beta * d) * eps;
  else if (type == "hinge")
    out.per_pair = at::relu(1 - beta * d);
  else if (type == "ipo")
    out.per_pair = (d - 1 / (2 * beta)).pow(2);
  else
    throw Error(ErrorCode::kInternal, "preference.loss_type " + type + " reached the CPO loss", "report this as a bug");
  return out;
}

Rewards orpo_losses(const at::Tensor& lc, const at::Tensor& lr, double beta) {
  Rewards out;
  out.log_odds = (lc - lr) - (log1mexp(lc) - log1mexp(lr));
  out.per_pair = -beta * at::log_sigmoid(out.log_odds);
  out.chosen = lc;
  out.rejected = lr;
  return out;
}

}  // namespace

const std::vector<std::string>& reference_free_metric_names(TrainObjective kind) {
  static const std::vector<std::string> cpo = [] {
    std::vector<std::string> names = preference_metric_names();
    names.push_back("nll_loss");
    return names;
  }();
  static const std::vector<std::string> orpo = [] {
    std::vector<std::string> names = cpo;
    names.insert(names.end(), {"log_odds_ratio", "log_odds_chosen"});
    return names;
  }();
  return kind == TrainObjective::kOrpo ? orpo : cpo;
}

void set_reference_free_loss(Objective& objective, TrainObjective kind, const config::PreferenceConfig& c) {
  const bool orpo = kind == TrainObjective::kOrpo;
  const std::string type = orpo ? "orpo" : kind == TrainObjective::kSimpo ? "simpo" : c.loss_type.at(0);
  const bool mean = orpo || type == "ipo" || type == "simpo";  // TRL's average_log_prob
  const double nll_weight = orpo ? 1.0 : c.cpo_alpha;
  const int64_t chunk = objective.chunk_tokens();
  objective.set_sequence_loss(reference_free_metric_names(kind), [=](const CausalLM&, const CausalLM::Hidden& h, const data::Batch& batch) {
    const int64_t n = batch.pairs;
    if (n > 0 && !(batch.chosen_targets_per_pair > 0))
      throw Error(ErrorCode::kInternal, "a reference-free preference batch without the step's chosen targets", "report this as a bug");
    const RowLogps rows = completion_logps(h, batch, chunk);
    // ORPO's NLL reads every target of the chosen sequences: a second pass over those labels.
    data::Batch whole_batch;
    if (orpo) {
      whole_batch = batch;
      whole_batch.labels = sequence_labels(batch);
    }
    const at::Tensor whole_plain = orpo ? completion_logps(h, whole_batch, chunk).plain : rows.plain;
    const bool with_grad = c10::GradMode::is_enabled() && h.hidden.requires_grad();
    // The loss's graph starts at each row's sums: over its completion, and (orpo) over its sequence.
    const at::Tensor sums = rows.plain.clone().requires_grad_(with_grad), whole = whole_plain.clone().requires_grad_(with_grad && orpo);
    const at::Tensor tokens = (batch.labels != data::kIgnoreIndex).sum(-1).to(at::kFloat);
    const auto half = [n](const at::Tensor& x, int64_t which) { return pair_half(x, which, n); };
    const at::Tensor logps = mean ? sums / tokens.clamp_min(1.0) : sums;
    const at::Tensor lc = half(logps, 0), lr = half(logps, 1);
    const Rewards r = orpo ? orpo_losses(lc, lr, c.beta) : cpo_losses(lc, lr, type, c);
    const at::Tensor chosen_nll = -half(orpo ? whole : sums, 0);
    const double per_pair_targets = n > 0 ? batch.chosen_targets_per_pair : 1.0;
    at::Tensor loss = r.per_pair.sum();
    if (nll_weight != 0) loss = loss + nll_weight * chosen_nll.sum() / per_pair_targets;
    SequenceLossValue v;
    v.sum = loss.detach();
    if (with_grad) {  // d loss / d each row's sums, then the model's gradient through the chunked head
      std::vector<at::Tensor> inputs = {sums};
      if (orpo) inputs.push_back(whole);
      const std::vector<at::Tensor> g = torch::autograd::grad({loss}, inputs, {}, false, false, true);
      const at::Tensor& labels = orpo ? whole_batch.labels : batch.labels;
      const at::Tensor completion = (batch.labels != data::kIgnoreIndex).to(at::kFloat);
      at::Tensor per_token = (g[0].defined() ? g[0] : at::zeros_like(sums)).unsqueeze(-1) * completion;
      if (orpo && g[1].defined()) per_token = per_token + g[1].unsqueeze(-1) * (labels != data::kIgnoreIndex).to(at::kFloat);
      const at::Tensor surrogate =
          chunked_linear_cross_entropy(h.hidden.reshape({-1, h.hidden.size(-1)}), h.head, labels.reshape({-1}),
                                       chunk > 0 ? chunk : labels.numel(), data::kIgnoreIndex, (-per_token).reshape({-1}).contiguous());
      v.sum = v.sum + (surrogate - surrogate.detach()).to(v.sum.scalar_type());
    }
    const at::Tensor rc = c.beta * r.chosen.detach(), rr = c.beta * r.rejected.detach();
    const at::Tensor pairs = at::full({}, static_cast<double>(n), at::TensorOptions().dtype(at::kDouble).device(sums.device()));
    const at::Tensor chosen_rows = half((orpo ? whole_batch.labels : batch.labels).ne(data::kIgnoreIndex).sum(-1), 0).sum();
    v.metrics = {metric_term(rc.sum(), pairs),
                 metric_term(rr.sum(), pairs),
                 metric_term((rc > rr).sum(), pairs),
                 metric_term((rc - rr).sum(), pairs),
                 metric_term(lc.detach().sum(), pairs),
                 metric_term(lr.detach().sum(), pairs),
                 metric_term(half(rows.mean_logits, 0).sum(), half(tokens, 0).sum()),
                 metric_term(half(rows.mean_logits, 1).sum(), half(tokens, 1).sum()),
                 metric_term(chosen_nll.detach().sum(), chosen_rows)};
    if (orpo) {
      const at::Tensor odds = r.log_odds.detach();
      v.metrics.push_back(metric_term(at::log_sigmoid(odds).sum(), pairs));
      v.metrics.push_back(metric_term(odds.sum(), pairs));
    }
    return v;
  });
}

}  // namespace dstrain::model
