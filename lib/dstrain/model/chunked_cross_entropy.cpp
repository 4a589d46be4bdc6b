#include "dstrain/model/chunked_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ChunkedLinearLoss : torch::autograd::Function<ChunkedLinearLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& target_weights, int64_t chunk, int64_t ignore_index, bool with_grad, bool weight_grad,
                            ChunkTerm term) {
    const int64_t N = hidden.size(0);
    const at::ScalarType wide = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor total = at::zeros({}, hidden.options().dtype(wide));
    at::Tensor grad_hidden, grad_weight;
    if (with_grad) {
      grad_hidden = at::empty_like(hidden);
      // Summed over chunks in fp32; none for a frozen head (LoRA, train.freeze): its GEMM is the head's largest.
      if (weight_grad) grad_weight = at::zeros(weight.sizes(), weight.options().dtype(wide));
    }
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const at::Tensor h = hidden.narrow(0, s, n);
      const at::Tensor t = targets.narrow(0, s, n);
      at::Tensor logits = at::linear(h, weight).to(wide);  // [n, V]: the only chunk-sized buffers
      const at::Tensor lse = logits.logsumexp(-1, /*keepdim=*/true);
      const at::Tensor valid = t.ne(ignore_index);
      const at::Tensor weights =
          trained_row_weights(valid, target_weights.numel() > 0 ? target_weights.narrow(0, s, n) : target_weights, wide);
      total += term(logits, lse, t.masked_fill(valid.logical_not(), 0).unsqueeze(1), weights, with_grad);
      if (!with_grad) continue;
      const at::Tensor d_model = logits.to(hidden.scalar_type());  // the term's gradient, in place of the logits
      grad_hidden.narrow(0, s, n).copy_(at::mm(d_model, weight));
      if (weight_grad) grad_weight.add_(at::mm(d_model.t(), h));
    }
    if (with_grad) ctx->save_for_backward({grad_hidden, grad_weight});
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const at::Tensor& g = grad_outputs[0];
    return {saved[0] * g.to(saved[0].scalar_type()),
            saved[1].defined() ? (saved[1] * g.to(saved[1].scalar_type())).to(weight_dtype) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// The cross-entropy's chunk: lse - the target's logit, weighted; d / d logits = softmax - one_hot(target).
at::Tensor cross_entropy_term(at::Tensor& logits, const at::Tensor& lse, const at::Tensor& safe, const at::Tensor& weights,
                              bool with_grad) {
  const at::Tensor sum = ((lse - logits.gather(1, safe)).squeeze(1) * weights).sum();
  if (with_grad) {
    at::Tensor& d = logits.sub_(lse).exp_();
    d.scatter_add_(1, safe, at::full({logits.size(0), 1}, -1.0, d.options()));
    d.mul_(weights.unsqueeze(1));
  }
  return sum;
}

}  // namespace

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, int64_t chunk_tokens,
                                        int64_t ignore_index, const at::Tensor& target_weights) {
  return chunked_linear_loss(hidden, weight, targets, chunk_tokens, ignore_index, target_weights, cross_entropy_term);
}

at::Tensor trained_row_weights(const at::Tensor& valid, const at::Tensor& target_weights, at::ScalarType wide) {
  return target_weights.numel() > 0 ? target_weights.to(wide) * valid : valid.to(wide);
}

at::Tensor chunked_linear_loss(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets, int64_t chunk_tokens,
                               int64_t ignore_index, const at::Tensor& target_weights, ChunkTerm term) {
  const bool with_grad = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  // Always a defined tensor through autograd's apply (an undefined one has no device): empty when none.
  const at::Tensor given = target_weights.defined() ? target_weights : at::empty({0}, hidden.options().dtype(at::kFloat));
  return ChunkedLinearLoss::apply(hidden, weight, targets, given, std::max<int64_t>(1, chunk_tokens), ignore_index, with_grad,
                                  weight.requires_grad(), term);
}

}  // namespace dstrain::model
