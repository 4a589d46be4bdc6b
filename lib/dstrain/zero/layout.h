#pragma once
// How ZeRO lays the model out: the parameters, in the model's order (the global parameter index),
// are packed into flat units. A unit never spans two layer groups and holds at most
// `max_unit_elements` (one larger parameter gets a unit of its own). Each unit is padded to a
// multiple of world_size * kAlignment elements and split into world_size equal chunks: rank r owns
// chunk r of every unit, and its shard is those chunks back to back. Equal chunks let every
// collective be a plain reduce-scatter / all-gather; the padding (the uneven tail) is zeros.
// Pure arithmetic on sizes: no tensors, so it is unit-tested on its own.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::zero {

constexpr int64_t kAlignment = 16;  // elements: 64 bytes of fp32, one AVX-512 vector

struct ParamSlot {
  std::string name;
  int64_t numel = 0;
  int group = 0;       // layer group: 0 embeddings, 1..L decoder layers, L+1 the rest
  int unit = 0;        // the unit holding it
  int64_t offset = 0;  // within the unit's flat buffer
  bool decay = true;   // weight decay applies (not to norms, biases or routing biases)
};

struct Unit {
  int group = 0;
  int first_param = 0, num_params = 0;
  int64_t numel = 0;         // real elements
  int64_t padded = 0;        // numel rounded up to world_size * kAlignment
  int64_t flat_offset = 0;   // start in the full flat buffer (sum of earlier units' padded sizes)
  int64_t shard_offset = 0;  // start of this unit's chunk within every rank's shard
  int64_t chunk() const { return padded / world; }
  int world = 1;
};

// A run of one parameter inside one rank's shard: the optimizer's unit of work.
struct ShardSegment {
  int param = 0;
  int64_t shard_offset = 0;  // in the rank's shard
  int64_t param_offset = 0;  // in the parameter's own elements
  int64_t numel = 0;
  bool decay = true;
};

class Layout {
 public:
  struct Param {
    std::string name;
    int64_t numel = 0;
    int64_t ndim = 2;
  };
  // The parameters in the model's order.
  Layout(const std::vector<Param>& params, int world_size, int64_t max_unit_elements);

  int world_size() const { return world_; }
  const std::vector<ParamSlot>& params() const { return params_; }
  const std::vector<Unit>& units() const { return units_; }
  int64_t numel() const { return numel_; }      // real parameters
  int64_t flat_numel() const { return flat_; }  // with padding
  int64_t shard_numel() const { return flat_ / world_; }
  int num_groups() const { return num_groups_; }
  // The parameter runs rank `rank` owns, in shard order.
  std::vector<ShardSegment> segments(int rank) const;

 private:
  int world_;
  std::vector<ParamSlot> params_;
  std::vector<Unit> units_;
  int64_t numel_ = 0, flat_ = 0;
  int num_groups_ = 0;
};

// The decoder layer of a Hugging Face name ("model.layers.<i>.*" -> i), or -1.
int layer_index_of(const std::string& name);
// Weight decay applies to matrices, never to norms, biases or the MoE routing bias.
bool decays(const std::string& name, int64_t ndim);

}  // namespace dstrain::zero
