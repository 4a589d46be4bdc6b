#pragma once
// DeepSeek-V2/V3: Multi-head Latent Attention (low-rank q and kv, decoupled RoPE on a shared key
// part) and DeepSeekMoE (shared + routed experts; softmax or sigmoid scores; greedy, group-limited
// or V3's bias-corrected top-k; sequence-wise balance loss; aux-loss-free bias). Parameters carry
// the Hugging Face names. Routed tokens are grouped by expert (model/moe_experts.h), optionally
// with the experts spread over ranks (expert parallelism).
#include <cstdint>
#include <memory>

#include "dstrain/model/causal_lm.h"

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

class MlaMoeModel final : public CausalLM {
 public:
  // expert_group: expert parallelism (model/moe_experts.h): this rank holds only its block of
  // each layer's routed experts, under their global names; the group must outlive the model.
  MlaMoeModel(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype = c10::ScalarType::Float,
              comm::Communicator* expert_group = nullptr, Init init = Init::kRandom, const HeldGroups& held = {});
  ~MlaMoeModel() override;

  void move_buffers_to(const c10::Device& device) override;
  const NamedTensors& buffers() const override;  // model.layers.{i}.mlp.gate.e_score_correction_bias (noaux_tc)
  at::Tensor take_expert_load() override;
  double take_all_to_all_wait_ms() override;
  ExpertBlock local_experts() const override;
  std::vector<ExpertLayer> expert_layers() override;
  void update_expert_bias(const at::Tensor& global_load) override;

  struct Impl;  // defined in the .cpp; public so that the layer functions there can take it

 protected:
  Trunk trunk(int first, int last, const at::Tensor& x, const Input& input, at::Tensor* aux) const override;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::model
