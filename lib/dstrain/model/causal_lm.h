#pragma once
// The interface every model family offers the trainer: named parameters in a stable order (the
// global parameter index) with their places (layer group, routed expert, weight decay), the
// forward to the final hidden states (the loss lives in model/loss.h), logits, and the MoE hooks
// (expert load, bias update) that are no-ops for dense models.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/config/recipe.h"
#include "dstrain/model/attention.h"
#include "dstrain/model/linear.h"
#include "dstrain/model/named_tensor.h"
#include "dstrain/model/param_role.h"

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

class ParamBuilder;
class KvCache;
struct LocalExperts;

// Where a parameter belongs and what it is for, declared once by the model that made it (ZeRO
// lays the parameters out by it and never reads their names).
struct ParamPlace {
  int group = 0;        // layer group (LayerGate's numbering)
  int64_t expert = -1;  // a routed expert's parameter: the expert's index in this rank's block; -1 otherwise
  ParamRole role = ParamRole::kAttention;
  bool trains = true;  // false: frozen (no gradient, no optimizer state)
  bool decays() const { return model::decays(role); }
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

// Pipeline parallelism: the layer groups a model holds, as inclusive ranges of LayerGate's
// numbering (0 the embeddings, 1..L the decoder layers, L+1 the final norm and head); empty: all.
// A model holding some groups draws every parameter's initial values (the same stream as the
// whole model's) and keeps only its own, under their global names.
struct GroupRange {
  int first = 0, last = 0;
};
using HeldGroups = std::vector<GroupRange>;

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // What a forward reads besides the parameters: int64 tokens [B, T]; positions int64 [B, T]
  // (undefined: 0..T-1 in every row); attention_mask bool [B, 1, T, T], true = may attend
  // (undefined: causal); document_ids int64 [B, T]: attention stays within each document (the
  // attention scope builds the mask). embedded: the embeddings' output [B, T, H] for a pipeline
  // stage that runs multi-token prediction without group 0.
  // first_row: a training batch's first row in the global sample order (model::TrainingRows, which
  // keys LoRA's dropout); -1 in evaluation.
  // cache: generation (model/kv_cache.h): tokens are the new ones, positions and attention_mask
  // those KvCache::begin() returned; each layer stores its keys there and attends over all of it.
  struct Input {
    at::Tensor tokens, positions, attention_mask, embedded = {}, document_ids = {};
    int64_t first_row = -1;
    KvCache* cache = nullptr;
    // Sequence parallelism: tokens and positions are this rank's share of every row, document_ids
    // and attention_mask the whole rows' (set from set_sequence_group by hidden_states and run_groups).
    comm::Communicator* sequence = nullptr;
    at::Tensor ahead_tokens = {};  // ... and multi-token prediction's tokens after the share (data::Batch)
    AttentionScope scope() const { return AttentionScope::of(positions, document_ids, attention_mask, sequence); }
  };
  // Everything up to the head: the final norm's output [B, T, H], the head's weight [V, H], the
  // auxiliary losses (MoE balance, already weighted; undefined for dense models) and the final
  // layer group, entered: whatever is computed from hidden and head (logits, the loss's terms)
  // goes through close() before backward.
  // mtp: multi-token prediction's hidden states (model.mtp_depth, training forwards only): depth
  // k's [B, T - k, H] after its shared_head.norm, predicting at position i the token i + k + 1
  // through `head`. embedded: group 0's output when the forward ran it with MTP on (a pipeline's
  // first stage passes it on to the last).
  struct Hidden {
    at::Tensor hidden, head, aux;
    int final_group = 0;
    std::vector<at::Tensor> mtp = {};
    at::Tensor embedded = {};
  };
  Hidden hidden_states(const Input& input, bool with_aux = true) const;
  // A pipeline stage's part of the forward: groups [first, last] (all held) from `x`, the output
  // of group first - 1 (undefined when first is 0: the embeddings read input.tokens). Returns the
  // last group's output in `hidden`; when `last` is the final group, as hidden_states() does
  // (the final norm's output and the head, to be closed). aux: the stage's auxiliary losses.
  Hidden run_groups(int first, int last, const at::Tensor& x, const Input& input, bool with_aux = true) const;
  // The groups this model holds (HeldGroups; all of them when built whole).
  bool holds_group(int group) const;
  // LayerGate's numbering of the whole model: the final group (L + 1).
  int final_group() const { return final_group_; }
  at::Tensor close(const Hidden& h, const at::Tensor& value) const { return leave_group(h.final_group, value); }
  // Logits [B, T, vocab].
  at::Tensor logits(const Input& input) const;
  at::Tensor logits(const at::Tensor& tokens, const at::Tensor& attention_mask = {}) const {
    return logits(Input{tokens, {}, attention_mask});
  }
  // Activation checkpointing of the decoder layers (model/recompute.h): the same values and
  // gradients, less memory for one more forward of what is recomputed.
  void set_activation_checkpointing(config::Recompute mode) { recompute_mode_ = mode; }
  // Ulysses sequence parallelism (parallel.sequence_parallel_size): the group whose ranks share
  // each row's tokens; every forward's attention exchanges over it. nullptr: none.
  void set_sequence_group(comm::Communicator* group) { sequence_ = group; }
  comm::Communicator* sequence_group() const { return sequence_; }
  // Parameters in a fixed order with their HF names, as the family declared them (ParamBuilder).
  const NamedTensors& parameters() const { return params_; }
  // parameters()' places, in the same order, and the number of layer groups (embeddings, the
  // decoder layers, the final norm and head).
  const std::vector<ParamPlace>& parameter_places() const { return places_; }
  int num_groups() const { return num_groups_; }
  // The name a routed expert's parameter `index` (parameters()' order) has when it belongs to
  // the expert `expert` of all experts (its global name in another rank's block).
  std::string expert_parameter_name(size_t index, int64_t expert) const;
  // The model's projections (model/linear.h), in parameters()' order: where adapters, quantized
  // bases and matmul policies attach. linear(): by HF module name, or nullptr.
  std::vector<Linear*> linears();
  Linear* linear(const std::string& module);
  // Parameter `index` does not train (train.freeze, a base under adapters): no gradient, and
  // ZeRO keeps no optimizer state for it. Before the engine takes the parameters over.
  void freeze(size_t index);
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
  // Each MoE layer's routed experts this model holds, with their module prefix
  // (model.layers.3.mlp.experts.) and layer group: where lora.experts attaches adapters. None for
  // a dense model.
  struct ExpertLayer {
    std::string prefix;
    int group = 0;
    LocalExperts* experts = nullptr;
  };
  virtual std::vector<ExpertLayer> expert_layers() { return {}; }

  // The gate stays owned by the caller and must outlive every forward; nullptr removes it.
  void set_layer_gate(LayerGate* gate) { gate_ = gate; }

 protected:
  void enter_group(int group) const {
    if (gate_) gate_->before_group(group);
  }
  at::Tensor leave_group(int group, const at::Tensor& output) const { return gate_ ? gate_->after_group(group, output) : output; }
  LayerGate* gate_ = nullptr;
  config::Recompute recompute_mode_ = config::Recompute::kNone;
  comm::Communicator* sequence_ = nullptr;

  struct Trunk {
    at::Tensor hidden, head;
    int final_group = 0;
    std::vector<at::Tensor> mtp = {};
    at::Tensor embedded = {};
  };
  // The families' forward to the final norm (aux: where the auxiliary losses go, or nullptr).
  // Runs groups [first, last] of the model from x (undefined when first is 0: from input.tokens).
  virtual Trunk trunk(int first, int last, const at::Tensor& x, const Input& input, at::Tensor* aux) const = 0;
  // A family's constructor, before it adds parameters: what it holds and its final group.
  void hold_groups(HeldGroups held, int final_group) {
    held_ = std::move(held);
    final_group_ = final_group;
  }
  // A held group's forward entered and left through the gate; throws for one the model lacks.
  void check_held(int group) const;

 private:
  friend class ParamBuilder;  // the one way parameters are added
  NamedTensors params_;
  std::vector<ParamPlace> places_;
  std::vector<std::string> expert_names_;  // by parameter: a routed expert's name with "{}" for its global index, else empty
  std::deque<Linear> linears_;             // stable addresses: the families hold pointers
  int num_groups_ = 0;
  HeldGroups held_;
  int final_group_ = 0;
};

// The type of parameters, activations and gradients for a training precision.
c10::ScalarType scalar_type(config::Dtype dtype);

// kShapesOnly: every tensor on the meta device (names and shapes, no memory, no values; such
// a model cannot run), for checks of a 671B model on a laptop.
enum class Init { kRandom, kShapesOnly };

// The model of config.family, initialised from `seed` alone (identical on every rank), in
// `dtype` (float32 for training; float64 for gradient checks). expert_group: expert parallelism
// (MoE models only): the model holds this rank's block of routed experts (MlaMoeModel).
// held: a pipeline stage's groups (empty: the whole model).
std::unique_ptr<CausalLM> make_model(const config::ModelConfig& config, uint64_t seed, c10::ScalarType dtype = c10::ScalarType::Float,
                                     comm::Communicator* expert_group = nullptr, Init init = Init::kRandom, const HeldGroups& held = {});

// Every parameter's and buffer's HF name and shape, in model order, without allocating them
// (an MTP module's marked with its depth and not required one by one: all or none of it).
std::vector<NamedShape> model_tensor_shapes(const config::ModelConfig& config);
// A tensor that a model.init_from folder may lack, the model keeping its seeded values: a reward
// model's score.weight when the folder is a causal LM (transformers' from_pretrained does the same).
bool starts_fresh_in_folder(const config::ModelConfig& config, const std::string& name);
// The multi-token prediction module a tensor belongs to (HF's model.layers.{L + k - 1}.*: k), or 0.
int64_t mtp_depth_of(const config::ModelConfig& config, const std::string& name);

}  // namespace dstrain::model
