#include "dstrain/model/causal_lm.h"

#include <ATen/ATen.h>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/model/chunked_cross_entropy.h"
#include "dstrain/model/dense_model.h"
#include "dstrain/model/mla_moe_model.h"

namespace dstrain::model {

at::Tensor LossParts::mean() const {
  at::Tensor m = sum / static_cast<double>(std::max<int64_t>(count, 1));
  return aux.defined() ? m + aux : m;
}

at::Tensor CausalLM::forward(const at::Tensor& inputs, at::Tensor* aux, const at::Tensor& attention_mask) const {
  const Trunk t = trunk(inputs, aux, attention_mask);
  return leave_group(t.final_group, at::linear(t.hidden, t.head));
}

LossParts CausalLM::loss_parts(const at::Tensor& inputs, const at::Tensor& targets, const at::Tensor& attention_mask) const {
  at::Tensor aux;
  const Trunk t = trunk(inputs, &aux, attention_mask);
  const at::Tensor flat_targets = targets.reshape({-1});
  LossParts parts;
  if (loss_chunk_tokens_ > 0) {
    const at::Tensor hidden = t.hidden.reshape({flat_targets.size(0), -1});
    parts.sum = leave_group(t.final_group, chunked_linear_cross_entropy(hidden, t.head, flat_targets, loss_chunk_tokens_, kIgnoreIndex));
  } else {
    const at::Tensor out = leave_group(t.final_group, at::linear(t.hidden, t.head));
    // reduction 2 = sum (at::Reduction::Sum); ignored targets contribute nothing.
    // bf16/fp16 logits: the softmax and the sum run in fp32.
    const at::Tensor logits = out.scalar_type() == at::kDouble ? out : out.to(at::kFloat);
    parts.sum = at::cross_entropy_loss(logits.reshape({flat_targets.size(0), -1}), flat_targets, {}, at::Reduction::Sum, kIgnoreIndex);
  }
  parts.count = flat_targets.ne(kIgnoreIndex).sum().item<int64_t>();
  parts.aux = aux;
  return parts;
}

const NamedTensors& CausalLM::buffers() const {
  static const NamedTensors none;
  return none;
}

int64_t CausalLM::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.tensor.numel();
  return n;
}

at::Tensor document_causal_mask(const at::Tensor& inputs, int64_t eos) {
  const at::Tensor is_eos = inputs.eq(eos).to(at::kLong);
  const at::Tensor doc = is_eos.cumsum(1) - is_eos;  // EOS closes its own document
  const int64_t T = inputs.size(1);
  const at::Tensor causal = at::ones({T, T}, inputs.options().dtype(at::kBool)).tril();
  return (doc.unsqueeze(2) == doc.unsqueeze(1)).logical_and(causal).unsqueeze(1);
}

c10::ScalarType scalar_type(config::Dtype dtype) {
  switch (dtype) {
    case config::Dtype::kBf16:
      return c10::ScalarType::BFloat16;
    case config::Dtype::kFp16:
      return c10::ScalarType::Half;
    case config::Dtype::kFp32:
      break;
  }
  return c10::ScalarType::Float;
}

std::unique_ptr<CausalLM> make_model(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype,
                                     comm::Communicator* expert_group, Init init) {
  if (config.family == config::ModelFamily::kMlaMoe) return std::make_unique<MlaMoeModel>(config, seed, dtype, expert_group, init);
  if (expert_group && expert_group->world_size() > 1)
    throw Error(ErrorCode::kConfig, "expert parallelism needs an MoE model: this one is dense", "set moe.expert_parallel_size: 1");
  return std::make_unique<DenseModel>(config, seed, dtype, init);
}

std::vector<NamedShape> model_tensor_shapes(const config::ModelConfig& config) {
  const auto model = make_model(config, 0, c10::ScalarType::Float, nullptr, Init::kShapesOnly);
  std::vector<NamedShape> out;
  for (const auto& p : model->parameters()) out.push_back({p.name, p.tensor.sizes().vec(), true});
  for (const auto& b : model->buffers()) out.push_back({b.name, b.tensor.sizes().vec(), false});
  return out;
}

}  // namespace dstrain::model
