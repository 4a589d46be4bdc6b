#pragma once
// The interface every model family offers the trainer: named parameters in a stable order (the
// global parameter index), logits, a token-summed loss for token-weighted accumulation, and the
// MoE hooks (expert load, bias update) that are no-ops for dense models.
#include <cstdint>
#include <limits>
#include <memory>

#include "dstrain/config/enums.h"
#include "dstrain/config/recipe.h"
#include "dstrain/model/named_tensor.h"

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

constexpr int64_t kIgnoreIndex = -100;  // targets with this value do not count (HF convention)

struct LossParts {
  at::Tensor sum;     // summed next-token cross-entropy over counted targets (a scalar with grad)
  int64_t count = 0;  // counted targets
  at::Tensor aux;     // auxiliary losses (MoE balance), already weighted; zero for dense models
  // The mean cross-entropy plus the auxiliary losses.
  at::Tensor mean() const;
};

// Called by a model around each layer group (0 the embeddings, 1..L the decoder layers, L+1 the
// final norm and head): ZeRO stage 3 gathers a group's parameters before it runs and frees them
// after, and every stage uses the backward hook on a group's output to start communication early.
class LayerGate {
 public:
  virtual ~LayerGate() = default;
  virtual void before_group(int group) = 0;
  // Returns `output` (it may register a backward hook on it).
  virtual at::Tensor after_group(int group, const at::Tensor& output) = 0;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // Logits [B, T, vocab] for int64 inputs [B, T]. `attention_mask` (bool [B, 1, T, T], true =
  // may attend) replaces the causal mask, e.g. to keep attention within documents.
  at::Tensor logits(const at::Tensor& inputs, const at::Tensor& attention_mask = {}) const {
    return forward(inputs, nullptr, attention_mask);
  }
  // The loss computes the head's logits this many tokens at a time, fused with the
  // cross-entropy (chunked_cross_entropy.h); 0: all logits at once, then the cross-entropy.
  void set_loss_chunk_tokens(int64_t tokens) { loss_chunk_tokens_ = tokens; }
  int64_t loss_chunk_tokens() const { return loss_chunk_tokens_; }
  // Activation checkpointing of the decoder layers (model/recompute.h): the same values and
  // gradients, less memory for one more forward of what is recomputed.
  void set_activation_checkpointing(config::Recompute mode) { recompute_mode_ = mode; }
  // Cross-entropy against int64 targets [B, T] (kIgnoreIndex skipped) plus auxiliary losses.
  virtual LossParts loss_parts(const at::Tensor& inputs, const at::Tensor& targets, const at::Tensor& attention_mask = {}) const;
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets, const at::Tensor& attention_mask = {}) const {
    return loss_parts(inputs, targets, attention_mask).mean();
  }
  virtual const NamedTensors& parameters() const = 0;
  // State that is saved but not trained by gradients (V3's expert-selection bias).
  virtual const NamedTensors& buffers() const;
  // Moves what a forward reads besides the parameters (RoPE tables, MoE load counters and
  // buffers) to `device`. The ZeRO engine moves the parameters themselves.
  virtual void move_buffers_to(const c10::Device& device) = 0;
  int64_t num_parameters() const;

  // MoE: tokens routed to each expert since the last call, [moe layers, routed experts] (empty
  // for dense models); then the aux-loss-free bias update with the load summed over all ranks.
  virtual at::Tensor take_expert_load() { return {}; }
  virtual void update_expert_bias(const at::Tensor& global_load) {}
  // Expert parallelism: ms blocked on the token all-to-alls (forward and backward) since the last
  // call; NaN for a model that exchanges nothing.
  virtual double take_all_to_all_wait_ms() { return std::numeric_limits<double>::quiet_NaN(); }
  // The routed experts of each MoE layer this model holds: [first, first + count) (expert
  // parallelism holds a block; without it, all of them; a dense model, none).
  struct ExpertBlock {
    int64_t first = 0, count = 0;
  };
  virtual ExpertBlock local_experts() const { return {}; }

  // The gate stays owned by the caller and must outlive every forward; nullptr removes it.
  void set_layer_gate(LayerGate* gate) { gate_ = gate; }

 protected:
  void enter_group(int group) const {
    if (gate_) gate_->before_group(group);
  }
  at::Tensor leave_group(int group, const at::Tensor& output) const { return gate_ ? gate_->after_group(group, output) : output; }
  LayerGate* gate_ = nullptr;
  int64_t loss_chunk_tokens_ = 0;
  config::Recompute recompute_mode_ = config::Recompute::kNone;

  // Everything up to the head: the final norm's output [B, T, H], the head's weight [V, H], and
  // the final layer group, entered (the caller leaves it with the logits or the loss).
  struct Trunk {
    at::Tensor hidden, head;
    int final_group = 0;
  };
  virtual Trunk trunk(const at::Tensor& inputs, at::Tensor* aux, const at::Tensor& attention_mask) const = 0;
  // Logits plus auxiliary losses of the same forward pass.
  at::Tensor forward(const at::Tensor& inputs, at::Tensor* aux, const at::Tensor& attention_mask) const;
};

// Causal attention that stays within documents: token t sees token s <= t only when no
// `eos` token lies in [s, t) (the end-of-document token belongs to the document it ends).
// Returns bool [B, 1, T, T] for int64 inputs [B, T].
at::Tensor document_causal_mask(const at::Tensor& inputs, int64_t eos);

// The type of parameters, activations and gradients for a training precision.
c10::ScalarType scalar_type(config::Dtype dtype);

// kShapesOnly: every tensor on the meta device (names and shapes, no memory, no values; such
// a model cannot run), for checks of a 671B model on a laptop.
enum class Init { kRandom, kShapesOnly };

// The model of config.family, initialised from `seed` alone (identical on every rank), in
// `dtype` (float32 for training; float64 for gradient checks). expert_group: expert parallelism
// (MoE models only): the model holds this rank's block of routed experts (MlaMoeModel).
std::unique_ptr<CausalLM> make_model(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype = c10::ScalarType::Float,
                                     comm::Communicator* expert_group = nullptr, Init init = Init::kRandom);

// Every parameter's and buffer's HF name and shape, in model order, without allocating them.
std::vector<NamedShape> model_tensor_shapes(const config::ModelConfig& config);

}  // namespace dstrain::model
