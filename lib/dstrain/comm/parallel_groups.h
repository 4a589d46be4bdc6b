#pragma once
// The process groups of a config::ParallelLayout, made once per process (collective: every rank
// at the same point) and used by training, evaluation and `dstrain eval` alike:
//   world           borrowed (NCCL's on GPUs, else Gloo's)
//   data_parallel   P > 1: this stage's D data-parallel ranks (the ZeRO engine's group)
//   pipeline        P > 1: the P ranks of this data rank, one per stage (activations)
//   expert_parallel E > 1: E consecutive ranks of the data-parallel group (token exchanges)
//   expert_data     E > 1: the ranks of the data-parallel group with the same experts
//   sequence        S > 1: S consecutive ranks of the data-parallel group that share samples
//                   (Ulysses' all-to-alls around attention)
#include <memory>

#include "dstrain/comm/communicator.h"
#include "dstrain/config/parallel_layout.h"

namespace dstrain::comm {

struct ParallelGroups {
  config::ParallelLayout layout;
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> data_parallel, pipeline, expert_parallel, expert_data, sequence;
  // The data-parallel group: the stage's, or the world without a pipeline.
  Communicator& data() const { return data_parallel ? *data_parallel : *world; }
};

// Throws Error{kInternal} when `world` is not the layout's size.
ParallelGroups open_parallel_groups(Communicator& world, const config::ParallelLayout& layout);

}  // namespace dstrain::comm
