#pragma once
// torchtitan's Stateful idea for what a checkpoint holds besides the ZeRO engine's sharded
// tensors: each component says which tensors it saves, under their global names, and takes
// them back on resume. The values are the same on every rank; rank 0 writes them.
#include "dstrain/model/named_tensor.h"

namespace dstrain::model {

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The tensors to save (on any device; read, not kept). Their names, shapes and dtypes are
  // the same at every call.
  virtual NamedTensors state() const = 0;
  // Host tensors of the same names, shapes and dtypes, read from a checkpoint.
  virtual void load_state(const NamedTensors& state) = 0;
  // Whether a checkpoint may lack these tensors (written before the component existed): then
  // load_state gets an empty list and keeps its defaults.
  virtual bool state_optional() const { return false; }
};

// Tensors that are their own state (model buffers): saved as they are, loaded by copying.
class TensorState final : public Stateful {
 public:
  explicit TensorState(NamedTensors tensors) : tensors_(std::move(tensors)) {}
  NamedTensors state() const override { return tensors_; }
  void load_state(const NamedTensors& state) override {
    for (size_t i = 0; i < tensors_.size() && i < state.size(); ++i) tensors_[i].tensor.copy_(state[i].tensor);
  }

 private:
  NamedTensors tensors_;
};

}  // namespace dstrain::model
