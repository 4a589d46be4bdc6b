#pragma once
// How ZeRO lays the model out: the parameters, in the model's order (the global parameter index),
// are packed into flat units. A unit never spans two layer groups and holds at most
// `max_unit_elements` (one larger parameter gets a unit of its own). Each unit is padded to a
// multiple of world_size * kAlignment elements and split into world_size equal chunks: rank r owns
// chunk r of every unit, and its shard is those chunks back to back. Equal chunks let every
// collective be a plain reduce-scatter / all-gather; the padding (the uneven tail) is zeros.
// Expert parallelism adds a second domain: the routed experts' parameters are replicated only over
// the expert-data-parallel group (world / expert_parallel_size ranks), so their units are split
// into that many chunks, and a rank owns chunk <its place in that group> of them. Frozen
// parameters (model::ParamPlace::trains false) form units of their own: they are split and
// gathered like the others, but they have no gradient, no master copy and no optimizer state, so
// their chunks live in a separate "frozen shard" (the model-dtype parameters a stage-3 rank keeps)
// and the optimizer's segments never include them. A unit never spans two domains.
// Pure arithmetic on sizes: no tensors, so it is unit-tested on its own.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::zero {

constexpr int64_t kAlignment = 16;  // elements: 64 bytes of fp32, one AVX-512 vector

struct ParamSlot {
  std::string name;
  int64_t numel = 0;
  int group = 0;        // layer group: 0 embeddings, 1..L decoder layers, L+1 the rest
  int unit = 0;         // the unit holding it
  int64_t offset = 0;   // within the unit's flat buffer
  bool decay = true;    // weight decay applies (not to norms, biases or routing biases)
  bool expert = false;  // a routed expert's parameter (expert parallelism's domain)
  bool trains = true;   // false: frozen (the frozen domain)
};

struct Unit {
  int group = 0;
  int first_param = 0, num_params = 0;
  int64_t numel = 0;         // real elements
  int64_t padded = 0;        // numel rounded up to world_size * kAlignment
  int64_t flat_offset = 0;   // start in the full flat buffer (sum of earlier units' padded sizes)
  int64_t shard_offset = 0;  // start of this unit's chunk within every rank's shard (a frozen unit: within the frozen shard)
  int64_t chunk() const { return padded / world; }
  int world = 1;        // ranks the unit is split over: the world, or the expert-data-parallel group
  bool expert = false;  // routed experts' parameters (the expert domain)
  bool trains = true;   // false: frozen parameters (no gradient, master or optimizer state)
  // The unit's domain (the engine's Domain): 0 dense, 1 routed experts, 2 frozen dense, 3 frozen experts.
  int domain() const { return (expert ? 1 : 0) + (trains ? 0 : 2); }
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
  // A parameter as its model declares it (model::ParamPlace): the layout never reads names.
  struct Param {
    std::string name;
    int64_t numel = 0;
    int group = 0;        // layer group, from 0 in the model's order
    bool decay = true;    // weight decay applies
    bool expert = false;  // split over expert_world_size ranks instead of world_size
    bool trains = true;   // false: frozen
  };
  // The parameters in the model's order (groups never decrease). expert_world_size: the ranks
  // an expert parameter is split over (0: world_size, as every other parameter). num_groups: the
  // model's layer groups (0: one past the last parameter's).
  Layout(const std::vector<Param>& params, int world_size, int64_t max_unit_elements, int expert_world_size = 0, int num_groups = 0);

  int world_size() const { return world_; }
  int expert_world_size() const { return expert_world_; }
  const std::vector<ParamSlot>& params() const { return params_; }
  const std::vector<Unit>& units() const { return units_; }
  int64_t numel() const { return numel_; }        // real parameters
  int64_t flat_numel() const { return flat_; }    // with padding
  int64_t shard_numel() const { return shard_; }  // the trained units' chunks of one rank
  int64_t frozen_numel() const { return frozen_numel_; }
  int64_t frozen_shard_numel() const { return frozen_shard_; }  // the frozen units' chunks of one rank
  int num_groups() const { return num_groups_; }
  // The parameter runs a rank owns, in shard order: chunk `rank` of the dense units and chunk
  // `expert_rank` (its place in the expert-data-parallel group; -1: `rank`) of the expert units.
  // trained: the trained units' (the optimizer's work); false: the frozen units', with offsets in
  // the frozen shard.
  std::vector<ShardSegment> segments(int rank, int expert_rank = -1, bool trained = true) const;

 private:
  int world_, expert_world_;
  int64_t shard_ = 0, frozen_shard_ = 0, frozen_numel_ = 0;
  std::vector<ParamSlot> params_;
  std::vector<Unit> units_;
  int64_t numel_ = 0, flat_ = 0;
  int num_groups_ = 0;
};

}  // namespace dstrain::zero
